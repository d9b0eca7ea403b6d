//! `drover-scripted-agent`: a scripted ACP agent for tests; its directives and environment are
//! documented in `drover_fakes::scripted_agent`.

fn main() -> std::process::ExitCode {
    drover_fakes::scripted_agent::main()
}
