//! Schedules: create, list, pause, resume and delete them, and how a firing goes through the
//! operations (the send path for a followup, the create path for a new agent).
//!
//! Who may manage a schedule: a user, any; an agent, the ones it created and the ones whose
//! agent (the one they send to, or the parent of the agents they create) is itself or one of
//! its descendants. An agent lists only those. A schedule fires as its creator: an agent's
//! schedule to an agent it no longer controls (detached since) fails its run, named.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use drover_core::inbox::{Inbox, InboxMessage};
use drover_core::runtime::BoxFuture;
use drover_core::{AgentId, RegistryError};
use drover_protocol::{ScheduleNewAgent, ScheduleWhen};
use jiff::{SignedDuration, Timestamp};

use super::agents::{CreateAgent, Placement};
use super::messages::WhenSpent;
use super::{Caller, OpError, Ops, parse_agent, parse_workspace};
use crate::schedules::{
    Cadence, Deliver, NewAgentSpec, NewSchedule, RUN_LABEL, SCHEDULE_LABEL, Schedule,
    ScheduleError, ScheduleId, Target,
};

/// How far in the past a `once` time may be (clock skew between a client and the daemon)
/// before it is refused as a mistake.
const PAST_SLACK: SignedDuration = SignedDuration::from_secs(60);
/// The longest prompt a schedule keeps (it is stored in the schedule's file).
const MAX_PROMPT: usize = 64 * 1024;

/// What a schedule sends to.
#[derive(Debug, Clone)]
pub(crate) enum ScheduleFor {
    Agent(String),
    NewAgent(ScheduleNewAgent),
}

/// A schedule to make, as a front-end read it.
#[derive(Debug, Clone)]
pub(crate) struct CreateSchedule {
    pub(crate) target: ScheduleFor,
    pub(crate) prompt: String,
    pub(crate) when: ScheduleWhen,
    pub(crate) title: Option<String>,
}

/// A schedule id as a client wrote it: one that is not `sched-<n>` names no schedule.
pub(crate) fn parse_schedule(raw: &str) -> Result<ScheduleId, OpError> {
    raw.parse()
        .map_err(|_| ScheduleError::Unknown(raw.chars().take(80).collect()).into())
}

fn parse_time(field: &'static str, raw: &str) -> Result<Timestamp, OpError> {
    raw.parse::<Timestamp>().map_err(|e| {
        OpError::invalid(
            field,
            format!("`{raw}` is not a time with an offset (RFC 3339, e.g. 2026-12-24T09:00:00+01:00): {e}"),
        )
    })
}

/// The cadence `when` names, checked.
pub(crate) fn cadence_of(when: &ScheduleWhen, now: Timestamp) -> Result<Cadence, OpError> {
    let given = [
        when.at.is_some(),
        when.in_seconds.is_some(),
        when.every_seconds.is_some(),
        when.cron.is_some(),
    ]
    .iter()
    .filter(|g| **g)
    .count();
    if given != 1 {
        return Err(OpError::invalid(
            "when",
            "give exactly one of `at`, `inSeconds`, `everySeconds`, `cron`",
        ));
    }
    if when.time_zone.is_some() && when.cron.is_none() {
        return Err(OpError::invalid(
            "timeZone",
            "only a `cron` schedule has a time zone",
        ));
    }
    if when.start_at.is_some() && when.every_seconds.is_none() {
        return Err(OpError::invalid(
            "startAt",
            "only an `everySeconds` schedule has a start",
        ));
    }
    // Whole seconds from now: `in 2h` reads as a time, not as a nanosecond count.
    let now_s = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let after = |secs: u64| {
        now_s
            .checked_add(SignedDuration::from_secs(
                i64::try_from(secs).unwrap_or(i64::MAX),
            ))
            .map_err(|_| OpError::invalid("when", format!("{secs} seconds is too far away")))
    };
    let cadence = if let Some(at) = &when.at {
        let at = parse_time("at", at)?;
        if at < now - PAST_SLACK {
            return Err(OpError::invalid("at", format!("{at} is in the past")));
        }
        Cadence::Once { at }
    } else if let Some(secs) = when.in_seconds {
        Cadence::Once { at: after(secs)? }
    } else if let Some(every) = when.every_seconds {
        let from = match &when.start_at {
            Some(raw) => parse_time("startAt", raw)?,
            None => after(every)?,
        };
        Cadence::Every {
            every_secs: every,
            from,
        }
    } else {
        Cadence::Cron {
            expr: when.cron.clone().unwrap_or_default(),
            time_zone: when.time_zone.clone().unwrap_or_else(|| "UTC".to_string()),
        }
    };
    cadence.compile().map_err(ScheduleError::from)?;
    Ok(cadence)
}

impl Ops {
    /// Makes a schedule. An agent may schedule prompts to itself and its descendants, and new
    /// agents that are its subagents (the default from MCP) or detached.
    pub(crate) async fn create_schedule(
        &self,
        caller: Caller,
        request: CreateSchedule,
    ) -> Result<Schedule, OpError> {
        if request.prompt.trim().is_empty() {
            return Err(OpError::invalid("prompt", "must not be empty"));
        }
        if request.prompt.len() > MAX_PROMPT {
            return Err(OpError::invalid(
                "prompt",
                format!("at most {MAX_PROMPT} bytes"),
            ));
        }
        let cadence = cadence_of(&request.when, self.schedules.now())?;
        let target = match request.target {
            ScheduleFor::Agent(raw) => {
                let agent = self.controlled(caller, parse_agent(&raw)?)?;
                if agent.is_archived() {
                    return Err(RegistryError::Archived { agent: agent.id }.into());
                }
                self.registry.check_turn_gate(agent.id)?;
                Target::Agent { agent_id: agent.id }
            }
            ScheduleFor::NewAgent(spec) => Target::NewAgent(self.new_agent_spec(caller, spec)?),
        };
        Ok(self
            .schedules
            .create(NewSchedule {
                created_by: caller.agent(),
                title: request.title.filter(|t| !t.trim().is_empty()),
                target,
                prompt: request.prompt,
                cadence,
            })
            .await?)
    }

    /// Checks what can be checked of the agents a schedule will create.
    fn new_agent_spec(
        &self,
        caller: Caller,
        spec: ScheduleNewAgent,
    ) -> Result<NewAgentSpec, OpError> {
        let parent = spec
            .parent_agent_id
            .as_deref()
            .map(parse_agent)
            .transpose()?;
        if let Some(parent) = parent {
            let p = self.controlled(caller, parent)?;
            if p.is_archived() {
                return Err(RegistryError::Archived { agent: p.id }.into());
            }
        }
        let workspace_id = spec
            .workspace_id
            .as_deref()
            .map(parse_workspace)
            .transpose()?;
        if let Some(ws) = workspace_id {
            self.workspace(ws)?;
        }
        let cwd = spec.cwd.map(PathBuf::from);
        if let Some(cwd) = &cwd
            && !cwd.is_absolute()
        {
            return Err(OpError::invalid(
                "cwd",
                format!("`{}` is not absolute", cwd.display()),
            ));
        }
        if caller == Caller::User {
            if spec.provider.is_none() {
                return Err(OpError::invalid("provider", "name a provider"));
            }
            if cwd.is_none() && workspace_id.is_none() {
                return Err(OpError::invalid("cwd", "give `cwd` or `workspaceId`"));
            }
        }
        if let Some(provider) = &spec.provider {
            let providers = self.runtimes.providers()?;
            if providers.get(provider).is_none() {
                return Err(drover_acp::AcpError::UnknownProvider {
                    name: provider.clone(),
                    known: providers.all().map(|p| p.name.clone()).collect(),
                }
                .into());
            }
        }
        Ok(NewAgentSpec {
            provider: spec.provider,
            cwd,
            workspace_id,
            parent_agent_id: parent,
            title: spec.title,
            model: spec.model,
            permission_policy: spec.permission_policy,
            auto_archive: spec.auto_archive,
        })
    }

    /// Whether `caller` may see and manage `schedule`.
    fn manages(&self, caller: Caller, schedule: &Schedule) -> bool {
        let Caller::Agent(me) = caller else {
            return true;
        };
        if schedule.created_by == Some(me) {
            return true;
        }
        schedule
            .owner_agent()
            .is_some_and(|a| a == me || self.registry.ancestors(a).contains(&me))
    }

    fn managed(&self, caller: Caller, raw: &str) -> Result<ScheduleId, OpError> {
        let id = parse_schedule(raw)?;
        let schedule = self
            .schedules
            .get(id)
            .ok_or_else(|| ScheduleError::Unknown(id.to_string()))?;
        if self.manages(caller, &schedule) {
            Ok(id)
        } else {
            Err(OpError::NotPermitted(format!(
                "schedule `{id}` is not yours: you manage the schedules you made and those of yourself and your subagents"
            )))
        }
    }

    /// The schedules `caller` manages, or only those whose agent is `agent`.
    pub(crate) fn list_schedules(
        &self,
        caller: Caller,
        agent: Option<&str>,
    ) -> Result<Vec<Schedule>, OpError> {
        let agent = agent.map(parse_agent).transpose()?;
        if let Some(a) = agent {
            self.agent(a)?;
        }
        Ok(self
            .schedules
            .list()
            .into_iter()
            .filter(|s| agent.is_none_or(|a| s.owner_agent() == Some(a)))
            .filter(|s| self.manages(caller, s))
            .collect())
    }

    pub(crate) async fn pause_schedule(
        &self,
        caller: Caller,
        id: &str,
    ) -> Result<Schedule, OpError> {
        let id = self.managed(caller, id)?;
        Ok(self.schedules.set_paused(id, true).await?)
    }

    pub(crate) async fn resume_schedule(
        &self,
        caller: Caller,
        id: &str,
    ) -> Result<Schedule, OpError> {
        let id = self.managed(caller, id)?;
        let schedule = self
            .schedules
            .get(id)
            .ok_or_else(|| ScheduleError::Unknown(id.to_string()))?;
        if let Some(agent) = schedule.owner_agent() {
            // A schedule for an archived agent or lineage stays paused.
            self.registry.check_turn_gate(agent)?;
        }
        Ok(self.schedules.set_paused(id, false).await?)
    }

    pub(crate) async fn delete_schedule(
        &self,
        caller: Caller,
        id: &str,
    ) -> Result<ScheduleId, OpError> {
        let id = self.managed(caller, id)?;
        self.schedules.delete(id).await?;
        Ok(id)
    }

    /// What the schedules' timer fires into.
    pub(crate) fn schedule_sink(&self) -> Arc<dyn Deliver> {
        Arc::new(self.clone())
    }
}

fn creator(schedule: &Schedule) -> Caller {
    schedule.created_by.map_or(Caller::User, Caller::Agent)
}

impl Deliver for Ops {
    fn blocked(&self, schedule: &Schedule) -> Option<String> {
        let agent = schedule.owner_agent()?;
        if let Err(e) = self.registry.check_turn_gate(agent) {
            return Some(e.to_string());
        }
        // A schedule an agent made fires as that agent: once the target left its lineage
        // (detached), every run would be refused, so the schedule pauses instead.
        let creator = schedule.created_by?;
        let controls = agent == creator || self.registry.ancestors(agent).contains(&creator);
        (!controls).then(|| {
            format!(
                "agent `{agent}` is no longer `{creator}` (which made this schedule) or one of its subagents"
            )
        })
    }

    fn deliver(
        &self,
        schedule: &Schedule,
        message: InboxMessage,
        existing: Option<AgentId>,
    ) -> BoxFuture<'static, Result<AgentId, String>> {
        match &schedule.target {
            Target::Agent { agent_id } => {
                let (agent, sent) = (*agent_id, self.follow_up_run(schedule, *agent_id, message));
                Box::pin(async move { sent.await.map(|()| agent) })
            }
            Target::NewAgent(spec) => self.create_for_run(schedule, spec, message, existing),
        }
    }

    fn reached(&self, agent: AgentId, message_id: &str) -> bool {
        Inbox::reached(self.registry.home(), agent, message_id)
    }

    fn created_by_run(&self, schedule: ScheduleId, message_id: &str) -> Option<AgentId> {
        let schedule = schedule.to_string();
        self.registry
            .agents()
            .into_iter()
            .find(|a| {
                a.labels.get(SCHEDULE_LABEL) == Some(&schedule)
                    && a.labels.get(RUN_LABEL).map(String::as_str) == Some(message_id)
            })
            .map(|a| a.id)
    }
}

impl Ops {
    /// A run's prompt as a followup to the schedule's agent, as its creator.
    fn follow_up_run(
        &self,
        schedule: &Schedule,
        agent: AgentId,
        message: InboxMessage,
    ) -> BoxFuture<'static, Result<(), String>> {
        let ops = self.clone();
        let caller = creator(schedule);
        Box::pin(async move {
            // An agent that cannot run its queue now (its budget is spent, its start failed
            // and waits for a sign-in or a retry, its provider's limit was hit) keeps the run
            // queued until it can; one run at a time: while an earlier one of this schedule
            // waits, the next is refused, so nobody finds a pile of stale runs played at once.
            if let Some(held) = ops.why_held(agent) {
                let queued = ops
                    .runtimes
                    .queued(agent)
                    .await
                    .map_err(|e| e.to_string())?;
                if queued.iter().any(|m| m.source == message.source) {
                    return Err(format!(
                        "{held}; an earlier run of this schedule waits for it"
                    ));
                }
            }
            ops.queue_message(caller, agent, message, WhenSpent::Hold)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
    }

    /// Why `agent` cannot run what is queued for it now, if it cannot: its tree's budget is
    /// spent, its last start failed (waiting for a sign-in, its next try or the user), or it
    /// waits for its provider's usage limit.
    fn why_held(&self, agent: AgentId) -> Option<String> {
        if let Err(spent) = self.check_budget(agent) {
            return Some(spent.to_string());
        }
        let record = self.registry.get(agent)?;
        if let Some(failure) = &record.start_failure {
            return Some(if failure.sign_in.is_some() {
                format!(
                    "agent `{agent}` waits for a sign-in to {} (`drover login {}`)",
                    record.provider, record.provider
                )
            } else {
                format!("agent `{agent}` did not start (`drover retry {agent}` starts it again)")
            });
        }
        record.limited.as_ref().map(|_| {
            format!(
                "agent `{agent}` waits for {}'s usage limit",
                record.provider
            )
        })
    }

    /// Why the next run of a schedule that creates agents would only wait: an agent an
    /// earlier run made (not archived) waits for a sign-in.
    fn made_and_waits(&self, schedule: &Schedule) -> Option<String> {
        let id = schedule.id.to_string();
        let waiting = self.registry.agents().into_iter().find(|a| {
            a.labels.get(SCHEDULE_LABEL) == Some(&id)
                && !a.is_archived()
                && a.start_failure
                    .as_ref()
                    .is_some_and(|f| f.sign_in.is_some())
        })?;
        Some(format!(
            "agent `{}`, made by an earlier run of this schedule, waits for a sign-in to {} \
             (`drover login {}`); this run's agent would wait too",
            waiting.id, waiting.provider, waiting.provider
        ))
    }

    /// A run's agent, created as the schedule's creator (unless `existing`, one a crashed run
    /// created), with the run's prompt as its first message.
    fn create_for_run(
        &self,
        schedule: &Schedule,
        spec: &NewAgentSpec,
        message: InboxMessage,
        existing: Option<AgentId>,
    ) -> BoxFuture<'static, Result<AgentId, String>> {
        let ops = self.clone();
        let caller = creator(schedule);
        let labels = BTreeMap::from([
            (SCHEDULE_LABEL.to_string(), schedule.id.to_string()),
            (RUN_LABEL.to_string(), message.id.clone()),
        ]);
        let request = CreateAgent {
            provider: spec.provider.clone(),
            placement: Placement::Existing {
                cwd: spec.cwd.clone(),
                workspace: spec.workspace_id,
            },
            prompt: None,
            title: spec.title.clone().or_else(|| schedule.title.clone()),
            model: spec.model.clone(),
            mode: None,
            effort: None,
            labels,
            parent: spec.parent_agent_id,
            auto_archive: spec.auto_archive,
            permission_policy: spec.permission_policy,
            notify: None,
            on_interrupt: None,
            on_limit: None,
            budget: None,
            upstream: None,
            upstream_budgets: Vec::new(),
        };
        let waiting = existing
            .is_none()
            .then(|| self.made_and_waits(schedule))
            .flatten();
        Box::pin(async move {
            // Its agents would all wait for the same sign-in, each with its run, to be played
            // at once after it: one at a time.
            if let Some(why) = waiting {
                return Err(why);
            }
            let agent = match existing {
                Some(agent) => agent,
                None => {
                    ops.create_agent(caller, request)
                        .await
                        .map_err(|e| e.to_string())?
                        .agent
                        .id
                }
            };
            // As the user: the new agent is the schedule's own, whoever its parent is.
            ops.queue_message(Caller::User, agent, message, WhenSpent::Refuse)
                .await
                .map_err(|e| {
                    format!("agent `{agent}` was created, but its prompt was not queued: {e}")
                })?;
            Ok(agent)
        })
    }
}
