//! `drover providers`: the running daemon's view of the providers, else the config on disk.

use std::io::Write;
use std::path::Path;

use drover_protocol::ProviderSignIn;
use drover_protocol::answers;
use drover_protocol::requests as rq;
use serde_json::{Value, json};

use crate::client::Connection;
use crate::commands::{Ctx, print_json, unexpected};
use crate::error::CliError;
use crate::output::Paint;

/// `drover providers`: the running daemon's view, else the config on disk.
pub async fn providers(ctx: &Ctx, json: bool) -> anyhow::Result<()> {
    // Each provider, whether it can run, and (from a daemon) its sign-in.
    #[expect(clippy::type_complexity, reason = "one row of the listing")]
    let rows: Vec<(
        Value,
        bool,
        String,
        Option<ProviderSignIn>,
        Option<drover_protocol::ProviderWarm>,
    )> = match Connection::open(&ctx.endpoint, false).await {
        Ok((mut connection, _)) => {
            let answer = connection.request(rq::ListProviders::default()).await?;
            connection.close().await;
            let answers::Providers { providers, .. } =
                answer.into_answer().map_err(|m| unexpected(&m))?;
            providers
                .into_iter()
                .map(|p| {
                    let provider = json!({"name": p.name, "label": p.label, "command": p.command});
                    (
                        provider,
                        p.available,
                        p.detail,
                        Some(p.sign_in),
                        Some(p.warm),
                    )
                })
                .collect()
        }
        Err(e) if is_not_running(&e) && ctx.endpoint.url.is_none() => {
            local_providers(&ctx.endpoint.home)?
                .into_iter()
                .map(|(p, available, detail)| (p, available, detail, None, None))
                .collect()
        }
        Err(e) => return Err(e),
    };
    if json {
        let list: Vec<Value> = rows
            .into_iter()
            .map(|(provider, available, detail, sign_in, warm)| {
                let availability = if available {
                    json!({"state": "available", "path": detail})
                } else {
                    json!({"state": "unavailable", "reason": detail})
                };
                let mut entry =
                    json!({"provider": provider, "availability": availability, "signIn": sign_in});
                if let Some(warm) = warm.filter(|w| w.wanted > 0) {
                    entry["warm"] = json!(warm);
                }
                entry
            })
            .collect();
        return print_json(&list);
    }
    let width = rows
        .iter()
        .map(|(p, _, _, _, _)| p["name"].as_str().unwrap_or_default().len())
        .max()
        .unwrap_or(0);
    let mut out = std::io::stdout().lock();
    for (provider, available, detail, sign_in, warm) in rows {
        let name = provider["name"].as_str().unwrap_or_default();
        // The demo says what it is rather than where the drover binary is.
        let detail = if name == drover_acp::providers::DEMO_PROVIDER && available {
            provider["label"].as_str().unwrap_or_default().to_string()
        } else {
            detail
        };
        let state = if available {
            ctx.style.paint(Paint::Green, "available  ")
        } else {
            ctx.style.paint(Paint::Yellow, "unavailable")
        };
        writeln!(out, "{name:width$}  {state}  {detail}")?;
        match sign_in {
            Some(s) if s.state == "needs_sign_in" => {
                let how = s.how.unwrap_or_default();
                let label = ctx.style.paint(Paint::Yellow, "needs a sign-in");
                writeln!(out, "{:width$}  {label}: {how}", "")?;
            }
            Some(s) if s.state == "signed_in" && available => {
                writeln!(out, "{:width$}  signed in", "")?;
            }
            _ => {}
        }
        if let Some(warm) = warm.filter(|w| w.wanted > 0) {
            writeln!(out, "{:width$}  warm {}/{}", "", warm.ready, warm.wanted)?;
        }
    }
    Ok(())
}

fn is_not_running(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<CliError>(),
        Some(CliError::NotRunning { .. })
    )
}

fn local_providers(home: &Path) -> anyhow::Result<Vec<(Value, bool, String)>> {
    let providers = drover_acp::Providers::load(home)?;
    providers
        .all()
        .map(|p| {
            let (available, detail) = match providers.availability(p) {
                drover_acp::Availability::Available { path } => (true, path.display().to_string()),
                drover_acp::Availability::Unavailable { reason } => (false, reason),
            };
            Ok((serde_json::to_value(p)?, available, detail))
        })
        .collect()
}
