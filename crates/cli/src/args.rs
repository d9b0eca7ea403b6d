//! The command line: every command, option and its help text.

// These doc comments are clap's --help text, printed as written: backticks would show, and
// `<name>` or `[user@]` are what the help means, not HTML or links.
#![expect(clippy::doc_markdown)]
#![cfg_attr(
    doc,
    expect(rustdoc::invalid_html_tags, rustdoc::broken_intra_doc_links)
)]

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::error::CliError;
use clap::{Args, Parser, Subcommand, ValueEnum};
use drover_daemon::DaemonConfig;

#[derive(Debug, Parser)]
#[command(
    name = "drover",
    version,
    about = "Run and manage fleets of coding agents",
    after_help = "An ID is a full agent id, a unique prefix or suffix of it (the short handle \
                  `drover ls` shows), or an exact title.\n\
                  Exit codes: 0 ok, 1 error (or a failed turn, or a worktree holding work), \
                  2 usage, 3 no daemon running, 4 no such agent or workspace (or ambiguous), \
                  5 refused, 6 timeout, 130 interrupted."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the daemon is; every command takes these.
#[derive(Debug, Clone, Args)]
pub struct Global {
    /// Data directory [default: $DROVER_HOME, else ~/.drover]
    #[arg(long, global = true, value_name = "DIR")]
    pub home: Option<PathBuf>,
    /// The daemon's url (http://HOST:PORT) [default: the one in $DROVER_HOME/daemon.json]
    #[arg(long, global = true, env = "DROVER_URL", value_name = "URL")]
    pub url: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon in the foreground, or start, stop or check it in the background.
    Daemon(DaemonArgs),
    /// Create an agent and stream its reply until the turn ends.
    Run(RunArgs),
    /// Link other machines' daemons into this one's fleet (over SSH, or a command of your own).
    Host(HostArgs),
    /// Bridge stdin and stdout to this machine's daemon (what a hub's link runs over SSH);
    /// starts the daemon when none runs.
    Connect {
        /// One JSON message per line on stdin and stdout (the only mode)
        #[arg(long, required = true)]
        stdio: bool,
    },
    /// List agents.
    #[command(visible_alias = "list")]
    Ls {
        /// Include archived agents
        #[arg(long, short)]
        all: bool,
        /// Show subagents under their parent
        #[arg(long, short)]
        tree: bool,
        /// Print JSON (the agents as the protocol describes them)
        #[arg(long)]
        json: bool,
        /// Only the agents on this host (`local`: this machine's)
        #[arg(long, value_name = "NAME")]
        host: Option<String>,
        /// Only the agents that need you: a permission, a failure, a sign-in, an interrupted
        /// turn, a usage limit, a budget warning (not a plain finished turn)
        #[arg(long, conflicts_with_all = ["running", "errors"])]
        needs_me: bool,
        /// Only the agents running a turn or starting
        #[arg(long, conflicts_with = "errors")]
        running: bool,
        /// Only the agents whose runtime or last turn failed, or whose start failed
        #[arg(long)]
        errors: bool,
    },
    /// Follow an agent live; Ctrl-C detaches and leaves it running.
    Attach {
        /// The agent (id, unique prefix or suffix, or title)
        id: String,
        /// Recent timeline items to show first
        #[arg(long, value_name = "N", default_value_t = 20)]
        tail: usize,
        /// Print each update as a JSON line
        #[arg(long)]
        json: bool,
    },
    /// Send a message to an agent (queued for its next turn by default).
    Send {
        /// The agent (id, unique prefix or suffix, or title)
        id: String,
        /// The message (not empty; `-` reads it from stdin)
        #[arg(value_parser = not_blank)]
        message: String,
        /// Stop the current turn and run this message first
        #[arg(long, conflicts_with = "inject")]
        steer: bool,
        /// Add context to the next prompt without waking the agent
        #[arg(long)]
        inject: bool,
        /// Print the queued message's ids as JSON
        #[arg(long)]
        json: bool,
    },
    /// Wait until agents are idle with nothing queued (every one named); exit code 1 when the
    /// last turn of one failed.
    Wait {
        /// The agents (id, unique prefix or suffix, or title), one or more
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
        /// Give up after this many seconds, for all of them together (exit code 6)
        #[arg(long, value_name = "SECONDS")]
        timeout: Option<f64>,
    },
    /// Cancel an agent's running turn; queued messages then run unless --drop-queue.
    Stop {
        /// The agent (id, unique prefix or suffix, or title)
        id: String,
        /// Also discard the messages waiting in its inbox
        #[arg(long)]
        drop_queue: bool,
    },
    /// Archive an agent and its subagents (refused while work runs, unless --stop).
    Archive {
        /// The agent (id, unique prefix or suffix, or title)
        id: String,
        /// Stop what still runs instead of refusing
        #[arg(long)]
        stop: bool,
        /// Print what was archived and stopped as JSON
        #[arg(long)]
        json: bool,
    },
    /// Change an agent's mode, model, reasoning effort or another setting it offers
    /// (`drover inspect` lists them); kept for its later runs.
    Set {
        /// The agent (id, unique prefix or suffix, or title)
        id: String,
        /// The setting: `mode`, `model`, `effort`, or the id of an option the agent offers
        setting: String,
        /// Its new value
        value: String,
    },
    /// Set, raise or clear the budget of an agent and its whole subtree (at 100 % no new turn
    /// starts in the tree).
    Budget {
        /// The agent (id, unique prefix or suffix, or title)
        id: String,
        /// The most tokens the tree may spend
        #[arg(long, value_name = "N")]
        tokens: Option<u64>,
        /// The most the tree may cost (in the currency its agents report)
        #[arg(long, value_name = "X")]
        cost: Option<f64>,
        /// At 100 % cancel the turns running in the tree too (not only refuse new ones)
        #[arg(long, conflicts_with = "clear")]
        hard: bool,
        /// Remove the budget
        #[arg(long, conflicts_with_all = ["tokens", "cost"])]
        clear: bool,
    },
    /// Bring an archived agent back.
    Unarchive {
        /// The agent (id, unique prefix or suffix, or title; archived ones win a tie)
        id: String,
    },
    /// Make a subagent a top-level agent.
    Detach {
        /// The agent (id, unique prefix or suffix, or title)
        id: String,
    },
    /// Start an agent again whose start failed (its queued messages then run), or send now
    /// the prompt of one that waits for its provider's usage limit.
    Retry {
        /// The agent (id, unique prefix or suffix, or title)
        id: String,
    },
    /// Sign a provider in (an API key, its own login, or a login in this terminal); the
    /// agents of it that wait for a sign-in then start again.
    Login {
        /// The provider (`codex`, `claude`, `gemini`, ...)
        provider: String,
        /// The sign-in method's id (`drover providers --json` lists them); asked when there
        /// are several and this is a terminal
        #[arg(long, value_name = "ID")]
        method: Option<String>,
    },
    /// Show everything about one agent.
    Inspect {
        /// The agent (id, unique prefix or suffix, or title)
        id: String,
        /// Print the agent as JSON (as the protocol describes it, plus its children)
        #[arg(long)]
        json: bool,
    },
    /// Print an agent's timeline.
    Logs {
        /// The agent (id, unique prefix or suffix, or title)
        id: String,
        /// Only the last N items (that print: with --json every item counts)
        #[arg(long, short = 'n', value_name = "N")]
        tail: Option<usize>,
        /// Keep printing new items as they come (Ctrl-C stops)
        #[arg(long, short)]
        follow: bool,
        /// Print each item (and, with --follow, each update) as a JSON line
        #[arg(long)]
        json: bool,
    },
    /// Answer an agent's oldest pending permission request.
    Permit {
        /// The agent (id, unique prefix or suffix, or title)
        id: String,
        /// Allow or deny the request
        answer: PermitAnswer,
        /// Allow (or deny) this kind of request from now on
        #[arg(long)]
        always: bool,
    },
    /// List workspaces: where agents work, and what the agents in each are doing.
    Workspaces {
        /// Include archived workspaces
        #[arg(long, short)]
        all: bool,
        /// Print JSON (the workspaces as the protocol describes them, with `agentCount`)
        #[arg(long)]
        json: bool,
    },
    /// Make, list, check and remove the git worktrees drover makes for agents.
    Worktree(WorktreeArgs),
    /// Prompts on a timetable: to an agent (a followup each time) or to a new agent.
    Schedule(ScheduleArgs),
    /// Background jobs: shell commands the daemon runs on behalf of an agent.
    Job(JobArgs),
    /// Bring in agents you already have elsewhere (a dry run unless `--apply`).
    Import(ImportArgs),
    /// Notifications (`[notify]` in config.toml): how each sink's deliveries went, or a sample.
    Notify(NotifyArgs),
    /// List the providers and whether each can run (the daemon's view when it runs).
    Providers {
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script.
    Completions {
        /// The shell to complete for
        shell: clap_complete::Shell,
    },
    /// Open the web UI in the browser, logged in (the token rides in the address's fragment).
    Ui {
        /// Print the address instead of opening it
        #[arg(long)]
        print: bool,
    },
    /// Relay MCP between stdio and the daemon's HTTP MCP server (what drover gives agents
    /// that cannot speak MCP over HTTP themselves).
    #[command(hide = true)]
    McpProxy {
        /// The agent's MCP URL (`http://127.0.0.1:PORT/mcp/TOKEN`)
        url: String,
    },
    /// Be the demo agent: drover's scripted ACP agent on stdio (what the `demo` provider
    /// runs; see docs/demo.md).
    #[command(hide = true)]
    DemoAgent,
}

#[derive(Debug, Args)]
#[command(
    after_help = "A WS is a workspace's full id, a unique prefix or suffix of it (the \
                        handle `drover worktree ls` shows), its name, or its path."
)]
pub struct WorktreeArgs {
    #[command(subcommand)]
    pub action: WorktreeAction,
}

#[derive(Debug, Subcommand)]
pub enum WorktreeAction {
    /// List the worktree workspaces.
    #[command(visible_alias = "list")]
    Ls {
        /// Include archived (removed) worktrees
        #[arg(long, short)]
        all: bool,
        /// Print JSON (the workspaces as the protocol describes them, with `agentCount`)
        #[arg(long)]
        json: bool,
    },
    /// Make a git worktree of a checkout on a new branch, run its project's setup, and
    /// register it as a workspace; prints its path.
    New {
        /// Its folder name under $DROVER_HOME/worktrees/<project>/ [default: generated]
        name: Option<String>,
        /// The git checkout to branch from [default: the current directory]
        #[arg(long, value_name = "DIR")]
        repo: Option<PathBuf>,
        /// The new branch [default: drover/<name>]; it must not exist yet
        #[arg(long, value_name = "B")]
        branch: Option<String>,
        /// What to branch from: a branch, tag or commit [default: the checkout's HEAD]
        #[arg(long, value_name = "REF")]
        base: Option<String>,
        /// Print the workspace and the setup commands' runs as JSON
        #[arg(long)]
        json: bool,
    },
    /// Show what a worktree holds that exists nowhere else: uncommitted changes and unpushed
    /// commits. Exit code 0 when it holds none, 1 when it holds some.
    Status {
        /// The worktree workspace (id, unique prefix or suffix, name, or path)
        ws: String,
        /// Print the status as JSON
        #[arg(long)]
        json: bool,
    },
    /// Remove a worktree: archive its workspace and agents, run its teardown, delete its
    /// folder (and its branch when merged). Refused (exit code 5) while it holds uncommitted
    /// or unpushed work, unless --force.
    Rm {
        /// The worktree workspace (id, unique prefix or suffix, name, or path)
        ws: String,
        /// Remove it even with uncommitted or unpushed work (a branch with commits found
        /// nowhere else is kept all the same)
        #[arg(long)]
        force: bool,
        /// Print what was archived and removed as JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
#[command(
    after_help = "A schedule is named by its id (`sched-3`, or just `3`). Times are RFC 3339 \
                  (2026-12-24T09:00:00+01:00) or local (2026-12-24 09:00); durations are \
                  `90s`, `30m`, `2h`, `1d`, `1h 30m`."
)]
pub struct ScheduleArgs {
    #[command(subcommand)]
    pub action: ScheduleAction,
}

#[derive(Debug, Subcommand)]
pub enum ScheduleAction {
    /// Schedule a prompt; prints the schedule's id and its next run.
    Add(Box<ScheduleAdd>),
    /// List the schedules with their next run and last run.
    #[command(visible_alias = "list")]
    Ls {
        /// Only the schedules of this agent (id, unique prefix or suffix, or title)
        #[arg(long, value_name = "ID")]
        agent: Option<String>,
        /// Print JSON (the schedules as the protocol describes them)
        #[arg(long)]
        json: bool,
    },
    /// Delete a schedule.
    #[command(visible_alias = "delete")]
    Rm {
        /// The schedule (`sched-3` or `3`)
        schedule: String,
    },
    /// Pause a schedule: it does not fire until resumed.
    Pause {
        /// The schedule (`sched-3` or `3`)
        schedule: String,
    },
    /// Resume a paused schedule from now (missed runs are skipped).
    Resume {
        /// The schedule (`sched-3` or `3`)
        schedule: String,
    },
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["at", "in_", "every", "cron"])))]
#[command(group(clap::ArgGroup::new("target").required(true).args(["agent", "new"])))]
pub struct ScheduleAdd {
    /// Send to this agent as a followup (id, unique prefix or suffix, or title)
    #[arg(long, value_name = "ID")]
    pub agent: Option<String>,
    /// Create a new agent of this provider each time instead
    #[arg(long, value_name = "PROVIDER")]
    pub new: Option<String>,
    /// The new agent's working directory [default: the current directory]
    #[arg(long, value_name = "DIR", requires = "new")]
    pub cwd: Option<PathBuf>,
    /// Make each new agent a subagent of this agent
    #[arg(long, value_name = "ID", requires = "new")]
    pub parent: Option<String>,
    /// Once, at this time
    #[arg(long, value_name = "TIME")]
    pub at: Option<String>,
    /// Once, this long from now
    #[arg(long = "in", value_name = "DURATION")]
    pub in_: Option<String>,
    /// Every DURATION, the first time one DURATION from now (or at --start)
    #[arg(long, value_name = "DURATION")]
    pub every: Option<String>,
    /// With --every: the first run
    #[arg(long, value_name = "TIME", requires = "every")]
    pub start: Option<String>,
    /// By a cron expression (`0 9 * * 1-5`; 6 fields with seconds first; `@daily`)
    #[arg(long, value_name = "EXPR")]
    pub cron: Option<String>,
    /// With --cron: the time zone it is read in [default: this machine's, else UTC]
    #[arg(long, value_name = "ZONE", requires = "cron")]
    pub tz: Option<String>,
    /// A title for the schedule, shown by `drover schedule ls`
    #[arg(long, value_name = "T")]
    pub title: Option<String>,
    /// Print the schedule as JSON
    #[arg(long)]
    pub json: bool,
    /// What is sent each time (not empty)
    #[arg(value_parser = not_blank)]
    pub prompt: String,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    #[command(subcommand)]
    pub source: ImportSource,
}

#[derive(Debug, Subcommand)]
pub enum ImportSource {
    /// A Paseo home's agents: each record becomes an agent (status, title, labels, parent,
    /// archive, workspace and session kept); records imported before are skipped, and the
    /// home is only read.
    Paseo {
        /// The Paseo home (default: `$PASEO_HOME`, else `~/.paseo`)
        path: Option<PathBuf>,
        /// Import; without it, only say what would be imported
        #[arg(long)]
        apply: bool,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
    /// A provider's own past sessions, as its agent lists them (ACP `session/list`): each
    /// becomes an idle agent whose next message continues the session; sessions imported
    /// before, or already an agent's, are skipped.
    Sessions {
        /// The provider whose sessions to list (e.g. `codex`, `claude`)
        provider: String,
        /// Only the sessions in this directory
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        /// Only this session (by id; may be repeated)
        #[arg(long = "session", value_name = "ID")]
        sessions: Vec<String>,
        /// Import; without it, only say what would be imported
        #[arg(long)]
        apply: bool,
        /// Print JSON instead of text
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct NotifyArgs {
    #[command(subcommand)]
    pub action: NotifyAction,
}

#[derive(Debug, Subcommand)]
pub enum NotifyAction {
    /// Each sink: where it sends, what it sent and when, failures and the last error, what
    /// its full queue dropped and what its limit held back for a summary.
    Status {
        /// Print JSON (the sinks as the protocol describes them)
        #[arg(long)]
        json: bool,
    },
    /// Send a sample notification to SINK (every sink if left out); fails if one was not
    /// delivered after its retries.
    Test {
        /// The sink's `name` (see `drover notify status`)
        sink: Option<String>,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
#[command(
    after_help = "A job is named by its id (`job-3`, see `drover job ls`); an AGENT by its id, \
                  a unique prefix, its handle or its title."
)]
pub struct JobArgs {
    #[command(subcommand)]
    pub action: JobAction,
}

#[derive(Debug, Subcommand)]
pub enum JobAction {
    /// Start a job for AGENT: CMD run by `sh -c` in the agent's directory, in a process group
    /// of its own; prints the job's id. The agent gets a message when it ends.
    Start {
        /// The agent that owns the job
        agent: String,
        /// Run it in DIR [default: the agent's directory]
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        /// Add NAME=VALUE to its environment (repeatable)
        #[arg(long, short, value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// Kill it after SECONDS (at least 1)
        #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
        timeout: Option<u64>,
        /// Do not tell the agent when it ends
        #[arg(long)]
        no_notify: bool,
        /// Print the job as JSON
        #[arg(long)]
        json: bool,
        /// The command (one word is a shell command line; more are quoted and joined)
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// List jobs (of AGENT, if given): status, exit, time, output size.
    #[command(visible_alias = "list")]
    Ls {
        /// Only this agent's jobs (id, unique prefix, handle or title)
        agent: Option<String>,
        /// Print JSON (the jobs as the protocol describes them)
        #[arg(long)]
        json: bool,
    },
    /// Print a job's output (stdout and stderr, as they came).
    Logs {
        /// The job (`job-3`)
        id: String,
        /// Keep printing as the job writes (the daemon pushes it) until the job ends
        #[arg(long, short)]
        follow: bool,
        /// Start with the last N bytes
        #[arg(long, value_name = "N")]
        tail: Option<usize>,
    },
    /// Kill a job: TERM to its process group, KILL after 3 s; returns once it ended.
    Kill {
        /// The job (`job-3`)
        id: String,
        /// Print the job as JSON
        #[arg(long)]
        json: bool,
    },
}

/// What happens to a turn a daemon restart cuts off (`--on-interrupt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnInterruptArg {
    /// Wait with attention `interrupted`
    Notify,
    /// Ask the agent, once, to continue
    Continue,
}

/// What happens when a turn hits the provider's usage limit (`--on-limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnLimitArg {
    /// Wait for the reset, then send the prompt again
    Wait,
    /// Fail the turn
    Fail,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PermitAnswer {
    Allow,
    Deny,
}

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct DaemonArgs {
    #[command(subcommand)]
    pub action: Option<DaemonAction>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

/// How the daemon listens.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on
    #[arg(long, env = "DROVER_LISTEN", value_name = "ADDR", default_value_t = DaemonConfig::default_listen())]
    pub listen: SocketAddr,
    /// Let clients in without the token ($DROVER_HOME/token): any program or user of this
    /// machine can then drive the agents. Loopback only
    #[arg(long)]
    pub no_token: bool,
    /// Also accept requests addressed to this host name (besides localhost and IP
    /// addresses), e.g. a name in /etc/hosts; repeatable
    #[arg(long = "allow-host", value_name = "NAME")]
    pub allow_hosts: Vec<String>,
    /// How $DROVER_HOME/daemon.log is written: `text`, or `json` (one object per line, with
    /// the agent id, turn and request id as fields, for log shippers)
    #[arg(
        long,
        env = "DROVER_LOG_FORMAT",
        value_name = "FORMAT",
        default_value = "text"
    )]
    pub log_format: LogFormatArg,
}

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

impl LogFormatArg {
    pub fn format(self) -> drover_daemon::logging::LogFormat {
        match self {
            LogFormatArg::Text => drover_daemon::logging::LogFormat::Text,
            LogFormatArg::Json => drover_daemon::logging::LogFormat::Json,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LogFormatArg::Text => "text",
            LogFormatArg::Json => "json",
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum DaemonAction {
    /// Start the daemon in the background (output in $DROVER_HOME/daemon.out).
    Start {
        #[command(flatten)]
        serve: ServeArgs,
        /// How long to wait for it to answer
        #[arg(long, value_name = "SECONDS", default_value_t = 20.0)]
        timeout: f64,
    },
    /// Stop the background daemon (SIGTERM) and wait for it to exit.
    Stop {
        /// How long to wait for it to exit
        #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
        timeout: f64,
    },
    /// Say whether a daemon runs (exit code 0) or not (3).
    Status {
        /// Print the daemon's `/health` answer as JSON
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The first message (not empty; `-` reads it from stdin)
    #[arg(value_parser = not_blank)]
    pub prompt: String,
    /// Provider [default: $DROVER_PROVIDER, else codex]
    #[arg(long, short, value_name = "P")]
    pub provider: Option<String>,
    /// Working directory [default: the current directory]
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// A title, to name the agent by on the command line
    #[arg(long, short, value_name = "T")]
    pub title: Option<String>,
    /// Model [default: the provider's]
    #[arg(long, value_name = "M")]
    pub model: Option<String>,
    /// Session mode, such as `plan` [default: the provider's]
    #[arg(long, value_name = "M")]
    pub mode: Option<String>,
    /// Reasoning effort, such as `low` or `high`, where the agent offers it [default: the
    /// provider's]
    #[arg(long, value_name = "E")]
    pub effort: Option<String>,
    /// Make it a subagent of this agent
    #[arg(long, value_name = "ID")]
    pub parent: Option<String>,
    /// Run it on this host (see `drover host`; `auto`: the reachable one with the most free
    /// slots). --cwd is then a directory on that host, and must be given
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// Run it in a new git worktree of the checkout at --cwd, named NAME (see `drover
    /// worktree`)
    #[arg(long, value_name = "NAME")]
    pub worktree: Option<String>,
    /// What the worktree branches from: a branch, tag or commit [default: the checkout's HEAD]
    #[arg(long, value_name = "REF", requires = "worktree")]
    pub base: Option<String>,
    /// Detach: print the agent id and return at once
    #[arg(long, short)]
    pub detach: bool,
    /// Archive the agent when its work is done
    #[arg(long)]
    pub auto_archive: bool,
    /// Allow every permission request without asking
    #[arg(long)]
    pub allow_all: bool,
    /// A turn a restart of the daemon cuts off: wait for you (`notify`) or ask the agent to
    /// continue it (`continue`) [default: the provider's `on_interrupt`, else notify]
    #[arg(long, value_name = "POLICY")]
    pub on_interrupt: Option<OnInterruptArg>,
    /// A turn that hits the provider's usage limit: wait for the reset and send the prompt
    /// again (`wait`), or fail (`fail`) [default: the provider's `on_limit`, else wait]
    #[arg(long, value_name = "POLICY")]
    pub on_limit: Option<OnLimitArg>,
    /// A budget in tokens for the agent and its subagents: at 100 % no new turn starts
    #[arg(long, value_name = "N")]
    pub budget_tokens: Option<u64>,
    /// A budget in cost (the currency the agent reports) for the agent and its subagents
    #[arg(long, value_name = "X")]
    pub budget_cost: Option<f64>,
    /// With a budget: at 100 % cancel the turns running in the tree too
    #[arg(long)]
    pub budget_hard: bool,
    /// Print the agent (with -d) or each update as a JSON line
    #[arg(long)]
    pub json: bool,
}

/// A prompt or message with something in it: an empty one would give the agent nothing to do.
fn not_blank(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        return Err("it is empty; say what the agent should do".to_string());
    }
    Ok(text.to_string())
}

/// What room a message's request takes besides its text (ids, flags, the JSON around it).
const REQUEST_ROOM: usize = 16 * 1024;

/// The text of a prompt or message argument: `-` reads it from stdin (for a prompt kept in a
/// file, or longer than a command line takes). Refused, saying why, when it is empty or when
/// its request would pass what the daemon accepts from a client.
pub fn message_text(arg: String, stdin: impl std::io::Read) -> Result<String, CliError> {
    let text = if arg == "-" {
        let mut bytes = Vec::new();
        let mut stdin = stdin;
        stdin.read_to_end(&mut bytes).map_err(|e| {
            CliError::BadArgument(format!("cannot read the message from stdin: {e}"))
        })?;
        let text = String::from_utf8(bytes).map_err(|_| {
            CliError::BadArgument("the message on stdin is not UTF-8 text".to_string())
        })?;
        if text.trim().is_empty() {
            return Err(CliError::BadArgument(
                "the message on stdin is empty; say what the agent should do".to_string(),
            ));
        }
        text
    } else {
        arg
    };
    // The daemon closes a connection whose frame passes its limit; say so before sending.
    let encoded = serde_json::to_string(&text).map_or(usize::MAX, |s| s.len());
    let most = drover_protocol::MAX_CLIENT_FRAME - REQUEST_ROOM;
    if encoded > most {
        return Err(CliError::BadArgument(format!(
            "the message is too long: {} KiB as JSON, and the daemon takes at most {} KiB; \
             put the long part in a file in the agent's directory and tell the agent to read it",
            encoded.div_ceil(1024),
            most / 1024,
        )));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every argument and flag of every command says what it is for.
    #[test]
    fn every_argument_has_help() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && arg.get_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                if sub.get_about().is_none() && sub.get_name() != "help" {
                    missing.push(format!("{path} {} (no about)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "drover", &mut missing);
        assert!(missing.is_empty(), "no help for: {missing:#?}");
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}

#[derive(Debug, Args)]
pub struct HostArgs {
    #[command(subcommand)]
    pub action: HostAction,
}

#[derive(Debug, Subcommand)]
pub enum HostAction {
    /// Add a host: `drover host add box ssh://me@box` (or `--command …`)
    Add {
        /// Its name in the fleet (lower-case letters, digits, `-`)
        name: String,
        /// ssh://[user@]host[:port]
        #[arg(required_unless_present = "command", conflicts_with = "command")]
        address: Option<String>,
        /// The private key ssh uses
        #[arg(long, value_name = "FILE")]
        identity: Option<PathBuf>,
        /// An ssh option, `Key=value` (repeat for more)
        #[arg(long = "ssh-option", value_name = "KEY=VALUE")]
        ssh_options: Vec<String>,
        /// Instead of ssh: the command whose stdin and stdout reach the host's `drover
        /// connect --stdio`, e.g. "kubectl exec -i pod/drover -- drover connect --stdio"
        #[arg(long, value_name = "COMMAND")]
        command: Option<String>,
        /// Do not wait for the host to be reachable
        #[arg(long)]
        no_wait: bool,
        /// Copy this drover to the host (into ~/.local/bin) when it has none or another
        /// version (ssh hosts only)
        #[arg(long, conflicts_with = "command")]
        install: bool,
    },
    /// List the hosts: reachable or not, since when, agents, live runtimes, version
    Ls {
        /// Print JSON (the hosts as the protocol describes them)
        #[arg(long)]
        json: bool,
    },
    /// Remove a host (its agents go on running on its own daemon)
    Rm {
        /// The host's name
        name: String,
    },
}
