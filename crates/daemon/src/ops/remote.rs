//! An agent's subagents on other hosts: created there for it, archived with it.
//!
//! A subagent on host B of this daemon's agent P is B's agent (B's daemon owns its process,
//! inbox and timeline) created with P as its `upstream`: its parent label names P, and what it
//! tells P waits in B's outbox until this daemon has queued it in P's inbox (see `hosts`).
//! Archiving P asks every host that holds subagents of P's tree what they still run (the
//! answer counts in P's admission), archives them there first, then P's tree here. A host
//! that was given a subagent of the tree and cannot be asked now refuses the archive
//! (`host_unreachable`): archiving without it would leave its subagents running unseen.

use std::collections::HashSet;

use drover_core::{
    ActivityReport, AgentId, AgentStatus, ArchiveOptions, ArchiveOutcome, BulkArchiveOutcome,
    RegistryError, SkippedChild,
};
use drover_protocol::{ErrorCode, NoticeInfo};
use serde_json::{Value, json};

use super::agents::{CreateAgent, Placement};
use super::{Caller, OpError, Ops};

impl Ops {
    /// Sends `message` to `host`'s daemon; its answer's payload, or its refusal as this
    /// daemon's error (the host's code, message and details).
    pub(crate) async fn ask_host(&self, host: &str, message: Value) -> Result<Value, OpError> {
        let mut answer = self.hosts.forward(host, message).await?;
        let payload = answer
            .get_mut("payload")
            .map(Value::take)
            .unwrap_or_default();
        if answer.get("type").and_then(Value::as_str) != Some("request_error") {
            return Ok(payload);
        }
        Err(OpError::Remote {
            host: host.to_string(),
            code: payload
                .get("code")
                .cloned()
                .and_then(|c| serde_json::from_value(c).ok())
                .unwrap_or(ErrorCode::AgentError),
            message: payload
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("refused")
                .to_string(),
            details: payload.get("details").filter(|d| !d.is_null()).cloned(),
        })
    }

    /// Creates an agent on `host` for `caller` (MCP `create_agent` with `host`): the defaults
    /// are the caller's, as for an agent made here; a subagent's parent is remembered before
    /// the host is asked (see `hosts::Hosts::will_parent`). The new agent's `AgentInfo`, marked
    /// with its host.
    pub(crate) async fn create_on_host(
        &self,
        caller: Caller,
        request: CreateAgent,
        host: &str,
    ) -> Result<Value, OpError> {
        let me = match caller {
            Caller::Agent(id) => Some(self.agent(id)?),
            Caller::User => None,
        };
        if let Some(me) = &me {
            self.check_budget(me.id)?;
        }
        if let Some(parent) = request.parent {
            self.controlled(caller, parent)?;
            self.check_budget(parent)?;
        }
        let provider = request
            .provider
            .or_else(|| me.as_ref().map(|m| m.provider.clone()))
            .ok_or_else(|| OpError::invalid("provider", "name a provider"))?;
        let (cwd, worktree) = match request.placement {
            Placement::Existing {
                cwd: Some(cwd),
                workspace: None,
            } => (cwd, None),
            Placement::NewWorktree {
                source: Some(source),
                options,
            } => (
                source,
                Some(json!({"name": options.name, "branch": options.branch, "base": options.base})),
            ),
            _ => {
                return Err(OpError::invalid(
                    "workspace",
                    format!(
                        "on host `{host}` name a directory there: {{\"kind\": \"current\", \"cwd\": \"<a path on {host}>\"}}, or a worktree of a repository there"
                    ),
                ));
            }
        };
        // The agent of this daemon the new one reports to: its parent, else whoever is told.
        // A subagent is held to its parent's budgets there from its first turn on.
        let upstream = request.parent.or(request.notify).map(|agent| {
            let subagent = request.parent == Some(agent);
            let budgets = if subagent {
                self.hosts.allowances(agent)
            } else {
                Vec::new()
            };
            strip_empty(json!({
                "agentId": agent.to_string(),
                "subagent": subagent,
                "notifyOnFinish": request.notify == Some(agent),
                "budgets": budgets,
            }))
        });
        let reports_to = request.parent.or(request.notify);
        if let Some(agent) = reports_to {
            self.hosts.will_parent(host, agent)?;
        }
        let permission_policy = request
            .permission_policy
            .or_else(|| me.as_ref().map(|m| m.config.permission_policy))
            .unwrap_or_default();
        let message = json!({
            "type": "create_agent",
            "provider": provider,
            "cwd": cwd,
            "prompt": request.prompt,
            "title": request.title,
            "model": request.model.or_else(|| me.as_ref().and_then(|m| m.config.model.clone())),
            "mode": request.mode,
            "effort": request.effort,
            "labels": request.labels,
            "autoArchive": request.auto_archive,
            "permissionPolicy": permission_policy,
            "onInterrupt": request.on_interrupt.or_else(|| me.as_ref().and_then(|m| m.config.on_interrupt)),
            "onLimit": request.on_limit.or_else(|| me.as_ref().and_then(|m| m.config.on_limit)),
            "budget": request.budget,
            "worktree": worktree,
            "upstream": upstream,
        });
        let message = strip_nulls(message);
        let answer = self.ask_host(host, message).await;
        if let Some(agent) = reports_to {
            // A refusal made nothing; a link that broke before the answer may have.
            let made = !matches!(answer, Err(OpError::Remote { .. }));
            self.hosts.parent_answered(host, agent, made);
        }
        let mut payload = answer?;
        let agent = payload
            .get_mut("agent")
            .map(Value::take)
            .unwrap_or_default();
        tracing::info!(%host, agent = ?agent.get("id"), by = caller.agent().map(tracing::field::display), "agent created on another host");
        Ok(agent)
    }

    /// Archives the agent and its cascade, here and on every host that holds subagents of
    /// its tree (those first). With running work anywhere in it: refused (`agent_active`,
    /// listing it, a host's marked with its host) unless `stop_activity`, which stops it.
    /// `dry_run` only says what would stop it.
    pub(crate) async fn archive(
        &self,
        caller: Caller,
        id: AgentId,
        stop_activity: bool,
        dry_run: bool,
    ) -> Result<ArchiveOutcome, OpError> {
        self.controlled(caller, id)?;
        let tree: HashSet<AgentId> = if self.hosts.any() {
            std::iter::once(id)
                .chain(self.registry.descendants(id))
                .collect()
        } else {
            HashSet::new()
        };
        let remote = if tree.is_empty() {
            Vec::new()
        } else {
            self.hosts.subagents_of(id, &tree).await?
        };
        if dry_run || (!remote.is_empty() && !stop_activity) {
            let mut report = self.registry.activity(id)?;
            for (host, child) in &remote {
                let asked =
                    json!({"type": "archive", "agentId": child.to_string(), "dryRun": true});
                let payload = self.ask_host(host, asked).await?;
                if let Ok(theirs) =
                    serde_json::from_value::<ActivityReport>(payload["stopped"].clone())
                {
                    merge(&mut report, theirs, host);
                }
            }
            if dry_run {
                return Ok(ArchiveOutcome {
                    archived: Vec::new(),
                    stopped: report,
                });
            }
            if !report.is_empty() {
                return Err(RegistryError::AgentActive(Box::new(report)).into());
            }
        }
        let mut archived_there = Vec::new();
        for (host, child) in &remote {
            let asked = json!({"type": "archive", "agentId": child.to_string(), "stopActivity": stop_activity});
            let payload = self.ask_host(host, asked).await?;
            archived_there.extend(
                payload["archived"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a.as_str()?.parse::<AgentId>().ok()),
            );
        }
        let mut outcome = self
            .registry
            .archive(id, ArchiveOptions { stop_activity })
            .await?;
        outcome.archived.extend(archived_there);
        if !tree.is_empty() {
            self.hosts.archived(&tree);
            self.hosts.sync_gates();
        }
        tracing::info!(agent = %id, stop_activity, hosts = remote.len(), by = caller.agent().map(tracing::field::display), "agent archived");
        Ok(outcome)
    }
}

impl Ops {
    /// "Archive finished" for `parent`'s subagents on other hosts: each that runs nothing is
    /// archived there (with its own cascade); the others are listed as skipped.
    pub(crate) async fn archive_idle_remote_children(
        &self,
        parent: AgentId,
        outcome: &mut BulkArchiveOutcome,
    ) -> Result<(), OpError> {
        for kid in self.hosts.subagents(parent) {
            let (Some(Ok(kid_id)), Some(host)) = (
                kid["id"].as_str().map(str::parse::<AgentId>),
                kid["host"].as_str(),
            ) else {
                continue;
            };
            let status = serde_json::from_value::<AgentStatus>(kid["status"].clone())
                .unwrap_or(AgentStatus::Idle);
            if status.is_busy() {
                outcome.skipped.push(SkippedChild {
                    agent_id: kid_id,
                    status,
                    activity: ActivityReport::default(),
                });
                continue;
            }
            let asked = json!({"type": "archive", "agentId": kid_id.to_string()});
            match self.ask_host(host, asked).await {
                Ok(payload) => outcome.archived.extend(
                    payload["archived"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|a| a.as_str()?.parse::<AgentId>().ok()),
                ),
                Err(OpError::Remote {
                    code: ErrorCode::AgentActive,
                    details,
                    ..
                }) => outcome.skipped.push(SkippedChild {
                    agent_id: kid_id,
                    status,
                    activity: details
                        .and_then(|d| serde_json::from_value(d).ok())
                        .unwrap_or_default(),
                }),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The host holding agent `id` when another host does, if `caller` may act on it there
    /// (`control`: a user always; an agent when the agent's lineage there reaches the caller
    /// or one of the caller's descendants, as for agents here). `None`: this daemon's own, or
    /// nobody's (the operation says so).
    pub(crate) fn on_host(
        &self,
        caller: Caller,
        id: AgentId,
        control: bool,
    ) -> Result<Option<String>, OpError> {
        if !self.hosts.any() || self.registry.get(id).is_some() {
            return Ok(None);
        }
        let Some((host, upstream)) = self.hosts.holder(id) else {
            return Ok(None);
        };
        if let (Caller::Agent(me), true) = (caller, control) {
            let mine =
                upstream.is_some_and(|u| u == me || self.registry.ancestors(u).contains(&me));
            if !mine {
                return Err(OpError::NotPermitted(format!(
                    "agent `{id}` (on host `{host}`) is not yours: you may control yourself and your own subagents (read-only tools work on any agent)"
                )));
            }
        }
        Ok(Some(host))
    }

    /// What this daemon's agents told agents of the hub that links to it, not yet taken.
    pub(crate) fn notices(&self) -> Vec<NoticeInfo> {
        self.runtimes
            .outbox()
            .pending()
            .iter()
            .map(crate::wire::notice_info)
            .collect()
    }

    /// The hub says whether the parent it holds of this daemon's subagent `id` is archived, or
    /// has an archived ancestor: the lineage gate across hosts.
    pub(crate) async fn set_upstream_gate(
        &self,
        id: AgentId,
        archived: Option<AgentId>,
    ) -> Result<(), OpError> {
        let agent = self.upstream_subagent(id)?;
        if agent.upstream_archived() != archived {
            self.registry.set_upstream_gate(id, archived).await?;
        }
        Ok(())
    }

    /// The hub says what this daemon's subagent `id` (one it made here) may spend with its
    /// subtree under each budget of its parent's lineage there (see
    /// `drover_core::UPSTREAM_BUDGET_LABEL`). When that lifts a spent one, what it held in the
    /// subtree goes, as after `set_budget`; when a hard one is now spent (the hub's own agents,
    /// or another host's, spent what the tree had left), the subtree's running turns are
    /// cancelled.
    pub(crate) async fn set_upstream_budget(
        &self,
        id: AgentId,
        budgets: Vec<drover_core::Budget>,
    ) -> Result<(), OpError> {
        let agent = self.upstream_subagent(id)?;
        let budgets = budgets
            .into_iter()
            .map(super::budgets::valid_budget)
            .collect::<Result<Vec<_>, _>>()?;
        if agent.upstream_budgets() != budgets {
            self.registry.set_upstream_budgets(id, budgets).await?;
            self.runtimes.wake_queued(&self.registry.tree(id)).await;
            self.runtimes.cancel_for_hard_budgets(id).await;
        }
        Ok(())
    }

    /// This daemon's agent `id`, when it is a subagent of an agent of another daemon (the hub's
    /// gates and budgets are set only on those).
    fn upstream_subagent(&self, id: AgentId) -> Result<drover_core::Agent, OpError> {
        let agent = self.agent(id)?;
        if agent
            .parent_id()
            .is_none_or(|p| self.registry.get(p).is_some())
        {
            return Err(OpError::invalid(
                "agentId",
                format!("agent `{id}` is not a subagent of an agent of another daemon"),
            ));
        }
        Ok(agent)
    }

    /// Each notice for an agent of the hub as it is queued.
    pub(crate) fn subscribe_notices(
        &self,
    ) -> tokio::sync::broadcast::Receiver<drover_core::outbox::Notice> {
        self.runtimes.outbox().subscribe()
    }

    /// The hub queued these notices: they leave the outbox.
    pub(crate) fn ack_notices(&self, ids: &[String]) -> Result<(), OpError> {
        self.runtimes
            .outbox()
            .ack(ids)
            .map_err(|e| OpError::Registry(e.into()))
    }
}

/// Adds what a host runs to `report`, each item marked with its host.
fn merge(report: &mut ActivityReport, theirs: ActivityReport, host: &str) {
    for (family, items) in theirs.families {
        report
            .families
            .entry(family)
            .or_default()
            .extend(items.into_iter().map(|mut item| {
                item.detail = format!("on host `{host}`: {}", item.detail);
                item
            }));
    }
}

/// `upstream` without an empty `budgets` (a host of an earlier version knows no such field).
fn strip_empty(mut upstream: Value) -> Value {
    if let Some(object) = upstream.as_object_mut()
        && object
            .get("budgets")
            .is_some_and(|b| b.as_array().is_some_and(Vec::is_empty))
    {
        object.remove("budgets");
    }
    upstream
}

/// The request without its absent fields (the protocol's defaults apply).
fn strip_nulls(mut message: Value) -> Value {
    if let Some(object) = message.as_object_mut() {
        object.retain(|_, v| !v.is_null());
    }
    message
}
