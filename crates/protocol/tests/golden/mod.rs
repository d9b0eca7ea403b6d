//! A file committed beside the code that the code generates: checked here, rewritten with
//! `DROVER_BLESS=1`.

use std::path::Path;

/// Fails unless the file at `path` (named `shown` in the message) holds `generated`; with
/// `DROVER_BLESS=1` writes it instead. `regenerate` is the command that does, `then` what to do
/// after it.
pub fn check(path: &Path, generated: &str, shown: &str, regenerate: &str, then: &str) {
    if std::env::var_os("DROVER_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(path, generated).unwrap_or_else(|e| panic!("write {shown}: {e}"));
        return;
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    if committed == generated {
        return;
    }
    let line = committed
        .lines()
        .zip(generated.lines())
        .position(|(a, b)| a != b)
        .map_or_else(
            || committed.lines().count().min(generated.lines().count()) + 1,
            |i| i + 1,
        );
    panic!(
        "{shown} is out of date with the wire types in crates/protocol (first difference at \
         line {line}).\nRegenerate it with:\n\n    {regenerate}\n\nthen {then}."
    );
}
