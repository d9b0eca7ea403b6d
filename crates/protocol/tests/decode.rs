//! Property tests of `decode_client`, the one door through which client frames enter the
//! daemon: whatever arrives, it answers `Ok` or an error with a stable code, and never panics;
//! every well-formed message survives a round trip.

use std::collections::BTreeMap;

use drover_protocol::{
    CLIENT_TYPES, ClientMessage, ClientRequest, Delivery, NewWorktree, PermissionPolicy,
    ScheduleNewAgent, ScheduleWhen, decode_client, requests,
};
use proptest::prelude::*;
use serde_json::{Map, Number, Value};

/// Field names the messages use, so that random objects often look almost right.
const FIELDS: &[&str] = &[
    "type",
    "host",
    "name",
    "when",
    "newAgent",
    "scheduleId",
    "requestId",
    "agentId",
    "client",
    "version",
    "protocolVersion",
    "capabilities",
    "token",
    "includeArchived",
    "limit",
    "before",
    "after",
    "provider",
    "cwd",
    "workspaceId",
    "prompt",
    "title",
    "model",
    "mode",
    "labels",
    "parentAgentId",
    "autoArchive",
    "permissionPolicy",
    "text",
    "delivery",
    "keepInbox",
    "stopActivity",
    "seq",
    "kind",
    "optionId",
    "cancel",
    "modeId",
    "modelId",
    "timeoutMs",
    "jobId",
    "command",
    "env",
    "timeoutS",
    "notifyOnExit",
    "offset",
    "tail",
    "maxBytes",
    "waitMs",
    "upstream",
    "subagent",
    "notifyOnFinish",
    "dryRun",
    "notifyUpstream",
    "ids",
    "archived",
    "terminalId",
    "cols",
    "rows",
    "data",
];

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        any::<String>().prop_map(Value::String),
        prop::sample::select(CLIENT_TYPES).prop_map(|t| Value::String(t.to_string())),
        prop::sample::select(&["followup", "steer", "inject", "ask", "allow", ""][..])
            .prop_map(|s| Value::String(s.to_string())),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((field_name(), inner), 0..8)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

fn field_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(FIELDS).prop_map(str::to_string),
        1 => any::<String>(),
    ]
}

/// An object with a known `type` and a random selection of known fields: the shape that
/// reaches serde's derived decoder most often.
fn near_message() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(CLIENT_TYPES),
        prop::collection::vec((field_name(), json_value()), 0..10),
    )
        .prop_map(|(kind, fields)| {
            let mut map: Map<String, Value> = fields.into_iter().collect();
            map.insert("type".to_string(), Value::String(kind.to_string()));
            Value::Object(map)
        })
}

fn opt_string() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(any::<String>())
}

fn delivery() -> impl Strategy<Value = Delivery> {
    prop_oneof![
        Just(Delivery::Followup),
        Just(Delivery::Steer),
        Just(Delivery::Inject)
    ]
}

fn policy() -> impl Strategy<Value = PermissionPolicy> {
    prop_oneof![Just(PermissionPolicy::Ask), Just(PermissionPolicy::Allow)]
}

fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    prop::collection::btree_map(any::<String>(), any::<String>(), 0..4)
}

/// Every client message, with every field varied.
// One arm per message type: the list reads best whole, next to the enum it mirrors.
#[expect(clippy::too_many_lines)]
fn client_message() -> impl Strategy<Value = ClientRequest> {
    prop_oneof![
        (
            any::<String>(),
            opt_string(),
            any::<u32>(),
            prop::collection::vec(any::<String>(), 0..4),
            opt_string(),
            any::<bool>()
        )
            .prop_map(
                |(client, version, protocol_version, capabilities, token, include_archived)| {
                    ClientRequest {
                        request_id: None,
                        message: ClientMessage::Hello(requests::Hello {
                            client,
                            version,
                            protocol_version,
                            capabilities,
                            token,
                            include_archived,
                        }),
                    }
                }
            ),
        (any::<String>(), opt_string(), any::<Option<usize>>()).prop_map(
            |(agent_id, request_id, limit)| ClientRequest {
                request_id,
                message: ClientMessage::InitializeAgentRequest(requests::InitializeAgentRequest {
                    agent_id,
                    limit
                })
            }
        ),
        (
            any::<String>(),
            opt_string(),
            any::<Option<u64>>(),
            any::<Option<u64>>(),
            any::<Option<usize>>()
        )
            .prop_map(|(agent_id, request_id, before, after, limit)| {
                ClientRequest {
                    request_id,
                    message: ClientMessage::FetchTimeline(requests::FetchTimeline {
                        agent_id,
                        before,
                        after,
                        limit,
                    }),
                }
            }),
        (
            (opt_string(), any::<String>(), opt_string(), opt_string()),
            (opt_string(), opt_string(), opt_string(), opt_string()),
            (labels(), opt_string(), any::<bool>(), policy()),
            (
                prop::option::of(new_worktree()),
                opt_string(),
                prop::option::of(prop_oneof![
                    Just(drover_protocol::OnInterrupt::Notify),
                    Just(drover_protocol::OnInterrupt::Continue)
                ]),
                prop::option::of(prop_oneof![
                    Just(drover_protocol::OnLimit::Wait),
                    Just(drover_protocol::OnLimit::Fail)
                ]),
                prop::option::of(budget()),
                opt_string(),
                prop::option::of(upstream())
            )
        )
            .prop_map(
                |(
                    (request_id, provider, cwd, workspace_id),
                    (prompt, title, model, mode),
                    (labels, parent_agent_id, auto_archive, permission_policy),
                    (worktree, effort, on_interrupt, on_limit, budget, host, upstream),
                )| ClientRequest {
                    request_id,
                    message: ClientMessage::CreateAgent(requests::CreateAgent {
                        provider,
                        cwd,
                        workspace_id,
                        prompt,
                        title,
                        model,
                        mode,
                        effort,
                        labels,
                        parent_agent_id,
                        auto_archive,
                        permission_policy,
                        on_interrupt,
                        on_limit,
                        budget,
                        worktree,
                        host,
                        upstream,
                    })
                }
            ),
        (
            opt_string(),
            any::<String>(),
            any::<String>(),
            delivery(),
            any::<bool>()
        )
            .prop_map(|(request_id, agent_id, text, delivery, notify_upstream)| {
                ClientRequest {
                    request_id,
                    message: ClientMessage::SendMessage(requests::SendMessage {
                        agent_id,
                        text,
                        delivery,
                        notify_upstream,
                    }),
                }
            }),
        (opt_string(), any::<String>(), any::<bool>()).prop_map(
            |(request_id, agent_id, keep_inbox)| ClientRequest {
                request_id,
                message: ClientMessage::Cancel(requests::Cancel {
                    agent_id,
                    keep_inbox
                })
            }
        ),
        (opt_string(), any::<String>(), any::<bool>(), any::<bool>()).prop_map(
            |(request_id, agent_id, stop_activity, dry_run)| ClientRequest {
                request_id,
                message: ClientMessage::Archive(requests::Archive {
                    agent_id,
                    stop_activity,
                    dry_run,
                })
            }
        ),
        (opt_string(), any::<String>()).prop_map(|(request_id, agent_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::Unarchive(requests::Unarchive { agent_id }),
            }
        }),
        (opt_string(), any::<String>()).prop_map(|(request_id, agent_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::Detach(requests::Detach { agent_id }),
            }
        }),
        (opt_string(), any::<String>()).prop_map(|(request_id, agent_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::ArchiveIdleChildren(requests::ArchiveIdleChildren {
                    agent_id,
                }),
            }
        }),
        (
            opt_string(),
            any::<String>(),
            any::<Option<u64>>(),
            opt_string(),
            opt_string(),
            any::<bool>()
        )
            .prop_map(|(request_id, agent_id, seq, kind, option_id, cancel)| {
                ClientRequest {
                    request_id,
                    message: ClientMessage::AnswerPermission(requests::AnswerPermission {
                        agent_id,
                        seq,
                        kind,
                        option_id,
                        cancel,
                    }),
                }
            }),
        (opt_string(), any::<String>(), any::<String>()).prop_map(
            |(request_id, agent_id, mode_id)| ClientRequest {
                request_id,
                message: ClientMessage::SetMode(requests::SetMode { agent_id, mode_id })
            }
        ),
        (opt_string(), any::<String>(), any::<String>()).prop_map(
            |(request_id, agent_id, model_id)| ClientRequest {
                request_id,
                message: ClientMessage::SetModel(requests::SetModel { agent_id, model_id })
            }
        ),
        (
            opt_string(),
            any::<String>(),
            any::<String>(),
            any::<String>()
        )
            .prop_map(|(request_id, agent_id, config_id, value)| {
                ClientRequest {
                    request_id,
                    message: ClientMessage::SetConfigOption(requests::SetConfigOption {
                        agent_id,
                        config_id,
                        value,
                    }),
                }
            }),
        (opt_string(), any::<String>(), opt_string()).prop_map(|(request_id, agent_id, title)| {
            ClientRequest {
                request_id,
                message: ClientMessage::SetTitle(requests::SetTitle { agent_id, title }),
            }
        }),
        (opt_string(), any::<String>(), prop::option::of(budget())).prop_map(
            |(request_id, agent_id, budget)| ClientRequest {
                request_id,
                message: ClientMessage::SetBudget(requests::SetBudget { agent_id, budget })
            }
        ),
        (opt_string(), any::<String>()).prop_map(|(request_id, agent_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::ClearAttention(requests::ClearAttention { agent_id }),
            }
        }),
        (opt_string(), any::<String>()).prop_map(|(request_id, agent_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::GetAgent(requests::GetAgent { agent_id }),
            }
        }),
        (opt_string(), any::<String>()).prop_map(|(request_id, workspace_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::WorkspaceChanges(requests::WorkspaceChanges {
                    workspace_id,
                }),
            }
        }),
        opt_string().prop_map(|request_id| ClientRequest {
            request_id,
            message: ClientMessage::ListProviders(requests::ListProviders::default())
        }),
        (opt_string(), any::<bool>()).prop_map(|(request_id, include_archived)| {
            ClientRequest {
                request_id,
                message: ClientMessage::ListAgents(requests::ListAgents { include_archived }),
            }
        }),
        (opt_string(), any::<String>(), any::<Option<u64>>()).prop_map(
            |(request_id, agent_id, timeout_ms)| ClientRequest {
                request_id,
                message: ClientMessage::WaitIdle(requests::WaitIdle {
                    agent_id,
                    timeout_ms
                })
            }
        ),
        (opt_string(), any::<bool>()).prop_map(|(request_id, include_archived)| {
            ClientRequest {
                request_id,
                message: ClientMessage::ListWorkspaces(requests::ListWorkspaces {
                    include_archived,
                }),
            }
        }),
        (opt_string(), any::<String>(), new_worktree()).prop_map(
            |(request_id, repository, worktree)| ClientRequest {
                request_id,
                message: ClientMessage::CreateWorktree(requests::CreateWorktree {
                    repository,
                    worktree,
                }),
            }
        ),
        (opt_string(), any::<String>()).prop_map(|(request_id, workspace_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::GetWorktreeStatus(requests::GetWorktreeStatus {
                    workspace_id,
                }),
            }
        }),
        (opt_string(), any::<String>(), any::<bool>()).prop_map(
            |(request_id, workspace_id, force)| ClientRequest {
                request_id,
                message: ClientMessage::ArchiveWorkspace(requests::ArchiveWorkspace {
                    workspace_id,
                    force
                })
            }
        ),
        (
            opt_string(),
            any::<String>(),
            schedule_when(),
            opt_string(),
            prop::option::of(schedule_new_agent()),
            opt_string()
        )
            .prop_map(|(request_id, prompt, when, agent_id, new_agent, title)| {
                ClientRequest {
                    request_id,
                    message: ClientMessage::CreateSchedule(requests::CreateSchedule {
                        prompt,
                        when,
                        agent_id,
                        new_agent,
                        title,
                    }),
                }
            }),
        (opt_string(), opt_string()).prop_map(|(request_id, agent_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::ListSchedules(requests::ListSchedules { agent_id }),
            }
        }),
        (opt_string(), any::<String>()).prop_map(|(request_id, schedule_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::PauseSchedule(requests::PauseSchedule { schedule_id }),
            }
        }),
        (opt_string(), any::<String>()).prop_map(|(request_id, schedule_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::ResumeSchedule(requests::ResumeSchedule { schedule_id }),
            }
        }),
        (opt_string(), any::<String>()).prop_map(|(request_id, schedule_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::DeleteSchedule(requests::DeleteSchedule { schedule_id }),
            }
        }),
        (
            opt_string(),
            any::<String>(),
            any::<String>(),
            opt_string(),
            labels(),
            prop::option::of(any::<u64>()),
            prop::option::of(any::<bool>())
        )
            .prop_map(
                |(request_id, agent_id, command, cwd, env, timeout_s, notify_on_exit)| {
                    ClientRequest {
                        request_id,
                        message: ClientMessage::StartJob(requests::StartJob {
                            agent_id,
                            command,
                            cwd,
                            env,
                            timeout_s,
                            notify_on_exit,
                        }),
                    }
                }
            ),
        (opt_string(), opt_string()).prop_map(|(request_id, agent_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::ListJobs(requests::ListJobs { agent_id }),
            }
        }),
        (
            opt_string(),
            any::<String>(),
            prop::option::of(any::<u64>()),
            prop::option::of(any::<usize>()),
            prop::option::of(any::<usize>()),
            prop::option::of(any::<u64>())
        )
            .prop_map(|(request_id, job_id, offset, tail, max_bytes, wait_ms)| {
                ClientRequest {
                    request_id,
                    message: ClientMessage::JobOutput(requests::JobOutput {
                        job_id,
                        offset,
                        tail,
                        max_bytes,
                        wait_ms,
                    }),
                }
            }),
        (
            opt_string(),
            any::<String>(),
            prop::option::of(any::<u64>())
        )
            .prop_map(|(request_id, job_id, offset)| ClientRequest {
                request_id,
                message: ClientMessage::FollowJob(requests::FollowJob { job_id, offset })
            }),
        (opt_string(), any::<String>()).prop_map(|(request_id, job_id)| ClientRequest {
            request_id,
            message: ClientMessage::UnfollowJob(requests::UnfollowJob { job_id })
        }),
        (opt_string(), any::<String>()).prop_map(|(request_id, job_id)| ClientRequest {
            request_id,
            message: ClientMessage::KillJob(requests::KillJob { job_id })
        }),
        (
            opt_string(),
            any::<String>(),
            prop::option::of(any::<u64>())
        )
            .prop_map(|(request_id, job_id, timeout_ms)| ClientRequest {
                request_id,
                message: ClientMessage::WaitJob(requests::WaitJob { job_id, timeout_ms })
            }),
        (opt_string(), any::<String>()).prop_map(|(request_id, agent_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::RestartAgent(requests::RestartAgent { agent_id }),
            }
        }),
        (
            opt_string(),
            any::<String>(),
            any::<String>(),
            prop::collection::btree_map(any::<String>(), any::<String>(), 0..3)
        )
            .prop_map(|(request_id, provider, method_id, vars)| ClientRequest {
                request_id,
                message: ClientMessage::SignIn(requests::SignIn {
                    provider,
                    method_id,
                    vars,
                })
            }),
        (opt_string(), any::<String>(), any::<bool>()).prop_map(|(request_id, path, apply)| {
            ClientRequest {
                request_id,
                message: ClientMessage::ImportPaseo(requests::ImportPaseo { path, apply }),
            }
        }),
        (
            opt_string(),
            any::<String>(),
            opt_string(),
            prop::collection::vec(any::<String>(), 0..3),
            any::<bool>()
        )
            .prop_map(|(request_id, provider, cwd, sessions, apply)| {
                ClientRequest {
                    request_id,
                    message: ClientMessage::ImportSessions(requests::ImportSessions {
                        provider,
                        cwd,
                        sessions,
                        apply,
                    }),
                }
            }),
        (opt_string(), opt_string()).prop_map(|(request_id, agent_id)| {
            ClientRequest {
                request_id,
                message: ClientMessage::Watching(requests::Watching { agent_id }),
            }
        }),
        opt_string().prop_map(|request_id| ClientRequest {
            request_id,
            message: ClientMessage::NotifyStatus(requests::NotifyStatus {})
        }),
        (opt_string(), opt_string()).prop_map(|(request_id, sink)| ClientRequest {
            request_id,
            message: ClientMessage::NotifyTest(requests::NotifyTest { sink })
        }),
        opt_string().prop_map(|request_id| ClientRequest {
            request_id,
            message: ClientMessage::TakeNotices(requests::TakeNotices {})
        }),
        (opt_string(), any::<String>(), opt_string()).prop_map(
            |(request_id, agent_id, archived)| ClientRequest {
                request_id,
                message: ClientMessage::SetUpstreamGate(requests::SetUpstreamGate {
                    agent_id,
                    archived
                })
            }
        ),
        (
            opt_string(),
            any::<String>(),
            prop::collection::vec(budget(), 0..3)
        )
            .prop_map(|(request_id, agent_id, budgets)| ClientRequest {
                request_id,
                message: ClientMessage::SetUpstreamBudget(requests::SetUpstreamBudget {
                    agent_id,
                    budgets
                })
            }),
        (opt_string(), prop::collection::vec(any::<String>(), 0..3)).prop_map(
            |(request_id, ids)| ClientRequest {
                request_id,
                message: ClientMessage::AckNotices(requests::AckNotices { ids })
            }
        ),
        opt_string().prop_map(|request_id| ClientRequest {
            request_id,
            message: ClientMessage::ListHosts(requests::ListHosts {})
        }),
        opt_string().prop_map(|request_id| ClientRequest {
            request_id,
            message: ClientMessage::Ping(requests::Ping {})
        }),
        (opt_string(), any::<String>()).prop_map(|(request_id, name)| ClientRequest {
            request_id,
            message: ClientMessage::RemoveHost(requests::RemoveHost { name })
        }),
        (
            opt_string(),
            any::<String>(),
            opt_string(),
            opt_string(),
            prop::collection::vec(any::<String>(), 0..3),
            prop::option::of(prop::collection::vec(any::<String>(), 0..3)),
        )
            .prop_map(|(request_id, name, ssh, identity, ssh_options, command)| {
                ClientRequest {
                    request_id,
                    message: ClientMessage::AddHost(requests::AddHost {
                        host: drover_protocol::HostConfig {
                            name,
                            ssh,
                            identity,
                            ssh_options,
                            command,
                        },
                    }),
                }
            }),
        (
            opt_string(),
            any::<String>(),
            prop::option::of(any::<u16>()),
            prop::option::of(any::<u16>())
        )
            .prop_map(|(request_id, workspace_id, cols, rows)| ClientRequest {
                request_id,
                message: ClientMessage::CreateTerminal(requests::CreateTerminal {
                    workspace_id,
                    cols,
                    rows
                })
            }),
        (opt_string(), opt_string()).prop_map(|(request_id, workspace_id)| ClientRequest {
            request_id,
            message: ClientMessage::ListTerminals(requests::ListTerminals { workspace_id })
        }),
        (
            opt_string(),
            any::<String>(),
            prop::option::of(any::<u64>())
        )
            .prop_map(|(request_id, terminal_id, offset)| ClientRequest {
                request_id,
                message: ClientMessage::AttachTerminal(requests::AttachTerminal {
                    terminal_id,
                    offset
                })
            }),
        (opt_string(), any::<String>()).prop_map(|(request_id, terminal_id)| ClientRequest {
            request_id,
            message: ClientMessage::DetachTerminal(requests::DetachTerminal { terminal_id })
        }),
        (opt_string(), any::<String>(), any::<String>()).prop_map(
            |(request_id, terminal_id, data)| ClientRequest {
                request_id,
                message: ClientMessage::TerminalInput(requests::TerminalInput {
                    terminal_id,
                    data
                })
            }
        ),
        (opt_string(), any::<String>(), any::<u16>(), any::<u16>()).prop_map(
            |(request_id, terminal_id, cols, rows)| ClientRequest {
                request_id,
                message: ClientMessage::ResizeTerminal(requests::ResizeTerminal {
                    terminal_id,
                    cols,
                    rows
                })
            }
        ),
        (opt_string(), any::<String>()).prop_map(|(request_id, terminal_id)| ClientRequest {
            request_id,
            message: ClientMessage::CloseTerminal(requests::CloseTerminal { terminal_id })
        }),
    ]
}

fn schedule_when() -> impl Strategy<Value = ScheduleWhen> {
    (
        opt_string(),
        prop::option::of(any::<u64>()),
        prop::option::of(any::<u64>()),
        opt_string(),
        opt_string(),
        opt_string(),
    )
        .prop_map(
            |(at, in_seconds, every_seconds, start_at, cron, time_zone)| ScheduleWhen {
                at,
                in_seconds,
                every_seconds,
                start_at,
                cron,
                time_zone,
            },
        )
}

fn schedule_new_agent() -> impl Strategy<Value = ScheduleNewAgent> {
    (
        opt_string(),
        opt_string(),
        opt_string(),
        opt_string(),
        opt_string(),
        prop::option::of(policy()),
        any::<bool>(),
    )
        .prop_map(
            |(
                provider,
                cwd,
                workspace_id,
                parent_agent_id,
                title,
                permission_policy,
                auto_archive,
            )| {
                ScheduleNewAgent {
                    provider,
                    cwd,
                    workspace_id,
                    parent_agent_id,
                    title: title.clone(),
                    model: title,
                    permission_policy,
                    auto_archive,
                }
            },
        )
}

/// A budget; costs in cents, which JSON carries exactly.
fn budget() -> impl Strategy<Value = drover_protocol::Budget> {
    (
        any::<Option<u64>>(),
        prop::option::of(0u32..10_000_000),
        any::<bool>(),
    )
        .prop_map(|(tokens, cents, hard)| drover_protocol::Budget {
            tokens,
            cost: cents.map(|c| f64::from(c) / 100.0),
            hard,
        })
}

fn upstream() -> impl Strategy<Value = requests::Upstream> {
    (
        any::<String>(),
        any::<bool>(),
        any::<bool>(),
        prop::collection::vec(budget(), 0..2),
    )
        .prop_map(
            |(agent_id, subagent, notify_on_finish, budgets)| requests::Upstream {
                agent_id,
                subagent,
                notify_on_finish,
                budgets,
            },
        )
}

fn new_worktree() -> impl Strategy<Value = NewWorktree> {
    (opt_string(), opt_string(), opt_string()).prop_map(|(name, branch, base)| NewWorktree {
        name,
        branch,
        base,
    })
}

/// What every decode must satisfy, whatever the input.
fn check_outcome(text: &str) -> Result<(), TestCaseError> {
    match decode_client(text) {
        Ok(message) => {
            // What decodes re-encodes, and decodes again to the same message.
            let again = serde_json::to_string(&message).expect("a decoded message encodes");
            prop_assert_eq!(decode_client(&again).ok(), Some(message));
        }
        Err(e) => {
            prop_assert!(
                e.code == "invalid_message" || e.code == "unknown_type",
                "unexpected code {}",
                e.code
            );
            prop_assert!(!e.message.is_empty());
            let value: Option<Value> = serde_json::from_str(text).ok();
            if e.code == "unknown_type" {
                let kind = value
                    .as_ref()
                    .and_then(|v| v.get("type"))
                    .and_then(Value::as_str);
                prop_assert!(kind.is_some_and(|k| !CLIENT_TYPES.contains(&k)));
            }
            // A readable `requestId` is echoed so that the client can match the error.
            let request_id = value
                .as_ref()
                .and_then(|v| v.get("requestId"))
                .and_then(Value::as_str);
            prop_assert_eq!(e.request_id.as_deref(), request_id);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_strings_never_panic(text in any::<String>()) {
        check_outcome(&text)?;
    }

    #[test]
    fn json_looking_strings_never_panic(text in r#"[{}\[\]":, a-zA-Z0-9_\\.-]{0,80}"#) {
        check_outcome(&text)?;
    }

    #[test]
    fn arbitrary_json_values_never_panic(value in json_value()) {
        check_outcome(&value.to_string())?;
    }

    #[test]
    fn almost_messages_never_panic(value in near_message()) {
        check_outcome(&value.to_string())?;
    }

    #[test]
    fn unknown_types_are_told_apart(kind in "[a-z_]{1,24}", request_id in any::<String>()) {
        prop_assume!(!CLIENT_TYPES.contains(&kind.as_str()));
        let text = serde_json::json!({"type": kind, "requestId": request_id}).to_string();
        let e = decode_client(&text).expect_err("unknown type");
        prop_assert_eq!(e.code, "unknown_type");
        prop_assert_eq!(e.request_id, Some(request_id));
    }

    #[test]
    fn well_formed_messages_round_trip(message in client_message()) {
        let text = serde_json::to_string(&message).expect("encodes");
        let decoded = decode_client(&text);
        prop_assert_eq!(decoded.as_ref().ok(), Some(&message), "{:?}", decoded.as_ref().err());
        prop_assert_eq!(decoded.as_ref().ok().and_then(ClientRequest::request_id), message.request_id());
    }

    #[test]
    fn an_unknown_field_is_refused_whatever_the_message(
        message in client_message(),
        field in "[a-z]{1,12}",
        extra in json_leaf(),
    ) {
        prop_assume!(!FIELDS.contains(&field.as_str()));
        let mut value = serde_json::to_value(&message).expect("encodes");
        value[field.as_str()] = extra;
        let e = decode_client(&value.to_string()).expect_err("unknown field");
        prop_assert_eq!(e.code, "invalid_message");
        prop_assert!(e.message.contains(&field), "{}", e.message);
    }
}

/// The generator above covers every client message type.
#[test]
fn the_generator_covers_every_type() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = client_message();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..2000 {
        let message = strategy.new_tree(&mut runner).expect("tree").current();
        let value = serde_json::to_value(&message).expect("encodes");
        seen.insert(value["type"].as_str().expect("type").to_string());
    }
    let all: std::collections::BTreeSet<String> =
        CLIENT_TYPES.iter().map(ToString::to_string).collect();
    assert_eq!(seen, all);
}

/// Inputs that once needed care; kept as fixtures.
#[test]
fn regression_fixtures() {
    for (text, code) in [
        ("", "invalid_message"),
        ("null", "invalid_message"),
        ("[]", "invalid_message"),
        ("\"hello\"", "invalid_message"),
        (r#"{"type":null}"#, "invalid_message"),
        (r#"{"type":7,"requestId":"r"}"#, "invalid_message"),
        (r#"{"type":"hello"}"#, "invalid_message"),
        (r#"{"type":"HELLO"}"#, "unknown_type"),
        (
            r#"{"type":"hello","client":"c","protocolVersion":-1}"#,
            "invalid_message",
        ),
        (
            r#"{"type":"hello","client":"c","protocolVersion":4294967296}"#,
            "invalid_message",
        ),
        (
            r#"{"type":"wait_idle","agentId":"a","timeoutMs":1.5}"#,
            "invalid_message",
        ),
        (
            r#"{"type":"send_message","agentId":"a","text":"t","delivery":"shout"}"#,
            "invalid_message",
        ),
        (
            r#"{"type":"list_providers","requestId":7}"#,
            "invalid_message",
        ),
        (
            &format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)),
            "invalid_message",
        ),
        (
            &format!(
                r#"{{"type":"list_agents","x":{}0{}}}"#,
                "[".repeat(200),
                "]".repeat(200)
            ),
            "invalid_message",
        ),
    ] {
        let e = decode_client(text).expect_err(text);
        assert_eq!(e.code, code, "{text}: {}", e.message);
    }
}
