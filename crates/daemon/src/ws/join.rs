//! Joining what waits for a session that is behind.
//!
//! A session writes every event that is ready at once (see `Session::on_event`). When it keeps
//! up, that is one event and nothing is joined or held. When its socket is slow, events wait
//! in its queue; the batch it takes then is joined before it is written: consecutive `append`s
//! to the same item and field of an agent (with nothing else of that agent between them)
//! become one `append` of their texts, and an agent's `agent_status` replaces the one before it
//! when nothing else of that agent came between them. A joined message takes the place of the
//! last one it joined, so every message keeps its order relative to every other, and what a
//! client rebuilds from them is the same as from the unjoined ones: a slow client gets fewer,
//! larger messages, and catches up.

use std::collections::HashMap;
use std::sync::Arc;

use drover_core::AgentId;
use drover_protocol::DaemonMessage;
use tokio_tungstenite::tungstenite::Utf8Bytes;

use super::coalesce::Joined;
use super::encode;
use crate::wire;

/// One message a session is about to write, with what joining needs to know of it.
pub(super) struct Queued {
    pub(super) text: Utf8Bytes,
    pub(super) kind: Kind,
}

pub(super) enum Kind {
    /// Nothing to join (a workspace or job update, a schedule).
    Other,
    /// Nothing is joined across it (a `resync_required` that ended the subscriptions).
    Barrier,
    /// An `agent_update` that is not an `append` (an `item`, a `patch`).
    Update(AgentId),
    /// An `append`: the chunks of `joined` from revision `from` on.
    Append { joined: Arc<Joined>, from: u64 },
    /// The agent's `agent_status` (its whole `AgentInfo`).
    Status(AgentId),
}

/// Joined appends: the first one's item, and the text so far.
struct Joining {
    joined: Arc<Joined>,
    from: u64,
    /// The message as it came, while only one is joined.
    single: Utf8Bytes,
    /// Set once a second is joined.
    text: Option<String>,
    last_revision: u64,
}

enum Entry {
    Plain(Utf8Bytes),
    Status(Utf8Bytes),
    Text(Joining),
}

/// The messages to write for `queued`, joined (see the module's doc).
pub(super) fn join(queued: Vec<Queued>) -> Vec<Utf8Bytes> {
    if queued.len() < 2 {
        return queued.into_iter().map(|q| q.text).collect();
    }
    let mut out: Vec<Option<Entry>> = Vec::with_capacity(queued.len());
    // Agent → where its last message so far is in `out`.
    let mut last: HashMap<AgentId, usize> = HashMap::new();
    for Queued { text, kind } in queued {
        match kind {
            Kind::Other => out.push(Some(Entry::Plain(text))),
            Kind::Barrier => {
                last.clear();
                out.push(Some(Entry::Plain(text)));
            }
            Kind::Update(agent) => {
                last.insert(agent, out.len());
                out.push(Some(Entry::Plain(text)));
            }
            Kind::Status(agent) => {
                if let Some(&i) = last.get(&agent)
                    && matches!(out[i], Some(Entry::Status(_)))
                {
                    out[i] = None;
                }
                last.insert(agent, out.len());
                out.push(Some(Entry::Status(text)));
            }
            Kind::Append { joined, from } => {
                let agent = joined.agent_id;
                let before = last.get(&agent).copied();
                let entry = match before.and_then(|i| out[i].take()) {
                    Some(Entry::Text(mut held))
                        if held.joined.seq == joined.seq
                            && held.joined.field == joined.field
                            && held.last_revision + 1 == from =>
                    {
                        let mut so_far = held
                            .text
                            .take()
                            .unwrap_or_else(|| held.joined.text_from(held.from).to_string());
                        so_far.push_str(joined.text_from(from));
                        held.text = Some(so_far);
                        held.last_revision = joined.last_revision();
                        Entry::Text(held)
                    }
                    other => {
                        // Not joinable: put back what was there.
                        if let (Some(i), Some(other)) = (before, other) {
                            out[i] = Some(other);
                        }
                        Entry::Text(Joining {
                            last_revision: joined.last_revision(),
                            joined,
                            from,
                            single: text,
                            text: None,
                        })
                    }
                };
                last.insert(agent, out.len());
                out.push(Some(entry));
            }
        }
    }
    out.into_iter()
        .flatten()
        .map(|entry| match entry {
            Entry::Plain(text) | Entry::Status(text) => text,
            Entry::Text(Joining {
                text: None, single, ..
            }) => single,
            Entry::Text(Joining {
                joined,
                text: Some(text),
                last_revision,
                ..
            }) => encode(&DaemonMessage::AgentUpdate(wire::update(
                &joined.event_at(last_revision, text),
            ))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_acp::TimelineEvent;
    use serde_json::Value;

    fn append(agent: AgentId, revision: u64, seq: u64, text: &str) -> Queued {
        let event = TimelineEvent {
            agent_id: agent,
            revision,
            update: drover_acp::TimelineUpdate::Append {
                seq,
                field: "text".to_string(),
                text: text.to_string(),
            },
        };
        let joined = Arc::new(Joined::single(&event).expect("an append"));
        Queued {
            text: encode(&DaemonMessage::AgentUpdate(wire::update(&event))),
            kind: Kind::Append {
                joined,
                from: revision,
            },
        }
    }

    fn plain(text: &'static str, kind: Kind) -> Queued {
        Queued {
            text: Utf8Bytes::from_static(text),
            kind,
        }
    }

    /// Each message as `(agent's text, op)` for appends, or its text.
    fn shown(texts: &[Utf8Bytes]) -> Vec<String> {
        texts
            .iter()
            .map(|t| match serde_json::from_str::<Value>(t.as_str()) {
                Ok(v) => {
                    let n = &v["payload"]["notification"];
                    format!("append {} {}", n["seq"], n["text"].as_str().unwrap_or("?"))
                }
                Err(_) => t.as_str().to_string(),
            })
            .collect()
    }

    #[test]
    fn one_message_is_written_as_it_came() {
        let agent = AgentId::new();
        let q = append(agent, 1, 7, "a");
        let text = q.text.clone();
        assert_eq!(join(vec![q]), [text]);
    }

    #[test]
    fn appends_to_one_item_become_one_in_the_place_of_the_last() {
        let (a, b) = (AgentId::new(), AgentId::new());
        let out = join(vec![
            append(a, 1, 7, "a"),
            append(b, 1, 3, "x"),
            append(a, 2, 7, "b"),
            plain("job", Kind::Other),
            append(a, 3, 7, "c"),
            append(b, 2, 3, "y"),
        ]);
        assert_eq!(shown(&out), ["job", "append 7 abc", "append 3 xy"]);
        // The joined one says the last revision's time and is a plain `append`.
        let v: Value = serde_json::from_str(out[1].as_str()).expect("JSON");
        assert_eq!(v["type"], "agent_update");
        assert_eq!(v["payload"]["agentId"], a.to_string());
        assert_eq!(v["payload"]["notification"]["op"], "append");
        assert_eq!(v["payload"]["notification"]["field"], "text");
    }

    #[test]
    fn anything_else_of_the_agent_between_keeps_appends_apart() {
        let a = AgentId::new();
        let out = join(vec![
            append(a, 1, 7, "a"),
            append(a, 2, 7, "b"),
            plain("patch", Kind::Update(a)),
            append(a, 4, 7, "c"),
            // Another item, then a gap in revisions: never joined.
            append(a, 5, 8, "d"),
            append(a, 7, 8, "e"),
            plain("status", Kind::Status(a)),
            append(a, 8, 8, "f"),
        ]);
        assert_eq!(
            shown(&out),
            [
                "append 7 ab",
                "patch",
                "append 7 c",
                "append 8 d",
                "append 8 e",
                "status",
                "append 8 f"
            ]
        );
    }

    #[test]
    fn an_agents_statuses_in_a_row_leave_the_last() {
        let (a, b) = (AgentId::new(), AgentId::new());
        let out = join(vec![
            plain("a1", Kind::Status(a)),
            plain("b1", Kind::Status(b)),
            plain("a2", Kind::Status(a)),
            append(a, 1, 1, "x"),
            plain("a3", Kind::Status(a)),
            plain("resync", Kind::Barrier),
            plain("a4", Kind::Status(a)),
        ]);
        assert_eq!(
            shown(&out),
            ["b1", "a2", "append 1 x", "a3", "resync", "a4"]
        );
    }

    #[test]
    fn a_part_of_a_joined_append_joins_from_where_it_starts() {
        let a = AgentId::new();
        let joined = Arc::new(Joined {
            agent_id: a,
            seq: 2,
            field: "text".to_string(),
            text: "abbccc".to_string(),
            first_revision: 5,
            ends: vec![1, 3, 6],
        });
        let out = join(vec![
            Queued {
                text: Utf8Bytes::from_static("bbccc"),
                kind: Kind::Append {
                    joined: joined.clone(),
                    from: 6,
                },
            },
            append(a, 8, 2, "d"),
        ]);
        assert_eq!(shown(&out), ["append 2 bbcccd"]);
    }
}
