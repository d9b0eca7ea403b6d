//! `drover notify status` and `drover notify test [SINK]`: the daemon's notification sinks
//! (`[notify]` in `config.toml`), over the client protocol.

use drover_protocol::answers;
use drover_protocol::requests as rq;
use jiff::Timestamp;

use crate::args::NotifyAction;
use crate::commands::{Ctx, print_json, unexpected};
use crate::error::{CliError, exit};
use crate::output::{self, Paint, Table};

pub async fn run(ctx: &Ctx, action: NotifyAction) -> anyhow::Result<()> {
    match action {
        NotifyAction::Status { json } => status(ctx, json).await,
        NotifyAction::Test { sink, json } => test(ctx, sink, json).await,
    }
}

/// One line per sink: what it sends to, what it wants, and how its deliveries went.
async fn status(ctx: &Ctx, json: bool) -> anyhow::Result<()> {
    let (mut connection, _) = ctx.connect().await?;
    let answer = connection.request(rq::NotifyStatus {}).await;
    connection.close().await;
    let answer = answer?;
    let answers::NotifyStatus { sinks, .. } = answer.into_answer().map_err(|m| unexpected(&m))?;
    if json {
        return print_json(&sinks);
    }
    if sinks.is_empty() {
        eprintln!("drover: no notification sinks; add a [[notify.sink]] to config.toml");
        return Ok(());
    }
    let now = Timestamp::now();
    let when = |at: &Option<String>| {
        at.as_deref()
            .map_or("-".to_string(), |t| output::when(t, now))
    };
    let mut table = Table::new(vec![
        "SINK",
        "KIND",
        "TARGET",
        "SENT",
        "LAST SENT",
        "FAILED",
        "DROPPED",
        "HELD",
        "LAST ERROR",
    ]);
    for sink in &sinks {
        let error = match (&sink.last_error, &sink.last_error_at) {
            (Some(error), at) => format!("{} ({})", output::truncate(error, 70), when(at)),
            (None, _) => "-".to_string(),
        };
        table.row(vec![
            (sink.name.clone(), Paint::Bold),
            (sink.kind.to_string(), Paint::Plain),
            (sink.target.clone(), Paint::Dim),
            (sink.sent.to_string(), Paint::Plain),
            (when(&sink.last_sent_at), Paint::Dim),
            (sink.failed.to_string(), Paint::Plain),
            (sink.dropped.to_string(), Paint::Plain),
            (sink.summarized.to_string(), Paint::Plain),
            (error, Paint::Plain),
        ]);
    }
    let mut out = std::io::stdout().lock();
    table.write(&mut out, ctx.style)?;
    Ok(())
}

/// Sends a sample to SINK (or every sink) and says how each went; fails if one failed.
async fn test(ctx: &Ctx, sink: Option<String>, json: bool) -> anyhow::Result<()> {
    let (mut connection, _) = ctx.connect().await?;
    let answer = connection.request(rq::NotifyTest { sink }).await;
    connection.close().await;
    let answer = answer?;
    let answers::NotifyTested { results, .. } = answer.into_answer().map_err(|m| unexpected(&m))?;
    if json {
        print_json(&results)?;
    } else {
        for result in &results {
            match &result.error {
                None => println!("{}: delivered", result.sink),
                Some(error) => println!("{}: not delivered: {error}", result.sink),
            }
        }
    }
    let failed = results.iter().filter(|r| !r.delivered).count();
    if failed == 0 {
        return Ok(());
    }
    Err(CliError::Reported {
        code: exit::ERROR,
        message: format!(
            "{failed} of {} sinks did not take the sample",
            results.len()
        ),
    }
    .into())
}
