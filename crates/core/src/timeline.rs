//! Durable per-agent timelines: everything an agent did, as items with increasing `seq`.
//!
//! On disk, `timelines/{agent-id}.jsonl` is an append-only log of entries, one JSON object per
//! line:
//!
//! ```text
//! {"op":"item","item":{"seq":7,"at":"…","kind":"agent_message","data":{"text":"Hel"}}}
//! {"op":"append","seq":7,"field":"text","text":"lo"}        streamed chunks coalesce into item 7
//! {"op":"patch","seq":5,"fields":{"status":"completed"}}     a tool call update merges into item 5
//! ```
//!
//! Reading folds the entries into items. A torn last line (a crash mid-write) is cut off when
//! the log is opened for writing, and skipped when it is read. Appends are not fsynced one by
//! one (a daemon crash keeps them: they are in the page cache); [`Timeline::sync`] makes them
//! durable against a machine crash at turn boundaries.
//!
//! The timeline knows nothing about ACP: the runtimes decide what happened, [`ItemKind`] names
//! the kinds they write (see `docs/storage.md`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::ids::AgentId;
use crate::jsonl::{self, Log};
use crate::store::StoreError;

/// One thing that happened, as clients see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineItem {
    pub seq: u64,
    pub at: Timestamp,
    /// One of [`ItemKind`]'s strings. Kept as written: a timeline from another drover may hold
    /// a kind this one does not know, and it still reads.
    pub kind: String,
    /// The item's fields (nested, so an agent's own `kind` or `seq` field never collides).
    pub data: Map<String, Value>,
    /// When a patch last changed it (a tool call that settled, a permission answered); absent
    /// for an item never patched, and in logs of drovers that did not record it.
    #[serde(default, rename = "updatedAt", skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<Timestamp>,
}

impl TimelineItem {
    /// Whether the item is of `kind`.
    pub fn is(&self, kind: ItemKind) -> bool {
        self.kind == kind.as_str()
    }
}

/// The kinds of item drover writes: the protocol's, stored and sent as their names.
pub(crate) use drover_protocol::ItemKind;

/// One line of the log, and the change live clients are sent (the same JSON:
/// `{"op":"item"|"append"|"patch",...}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Entry {
    Item {
        item: TimelineItem,
    },
    Append {
        seq: u64,
        field: String,
        text: String,
    },
    Patch {
        seq: u64,
        fields: Map<String, Value>,
        /// When the patch was made (absent in logs of drovers that did not record it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at: Option<Timestamp>,
    },
}

/// Which part of a timeline to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Page {
    /// The last `limit` items.
    Tail { limit: usize },
    /// Up to `limit` items just before `seq`.
    Before { seq: u64, limit: usize },
    /// Up to `limit` items just after `seq`.
    After { seq: u64, limit: usize },
}

/// A page of items, oldest first, and whether more lie beyond each end.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelinePage {
    pub items: Vec<TimelineItem>,
    pub has_older: bool,
    pub has_newer: bool,
    /// How many log entries the page reflects: a live update with a higher revision is newer
    /// than the page, one with a lower or equal revision is already in it.
    pub revision: u64,
}

/// The writer of one agent's timeline, with its items folded in memory.
#[derive(Debug)]
pub struct Timeline {
    log: Log,
    items: Vec<TimelineItem>,
    /// seq → index in `items`.
    index: HashMap<u64, usize>,
    next_seq: u64,
    /// Entries in the log (items, appends, patches).
    revision: u64,
}

impl Timeline {
    pub fn path_for(home: &Path, agent: AgentId) -> PathBuf {
        home.join("timelines").join(format!("{agent}.jsonl"))
    }

    /// Opens (creating) the timeline for appending: folds what is there and cuts a torn tail.
    pub fn open(home: &Path, agent: AgentId) -> Result<Timeline, StoreError> {
        let mut fold = Fold::default();
        let (log, revision) = Log::open(&Self::path_for(home, agent), |e| fold.apply(e))?;
        let Fold { items, index } = fold;
        let next_seq = items.last().map_or(1, |i| i.seq + 1);
        Ok(Timeline {
            log,
            items,
            index,
            next_seq,
            revision,
        })
    }

    /// Reads a page without opening for writing (a cold agent's history).
    pub fn read_page(home: &Path, agent: AgentId, page: Page) -> Result<TimelinePage, StoreError> {
        let mut fold = Fold::default();
        let revision = jsonl::read(&Self::path_for(home, agent), |e| fold.apply(e))?;
        Ok(paginate(&fold.items, page, revision))
    }

    pub fn page(&self, page: Page) -> TimelinePage {
        paginate(&self.items, page, self.revision)
    }

    /// How many entries the log holds: each push, append or patch adds one.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    pub fn items(&self) -> &[TimelineItem] {
        &self.items
    }

    pub fn get(&self, seq: u64) -> Option<&TimelineItem> {
        self.index.get(&seq).map(|i| &self.items[*i])
    }

    pub fn last(&self) -> Option<&TimelineItem> {
        self.items.last()
    }

    /// Whether the last turn that started has not ended (no `turn_ended` after its
    /// `turn_started`): a turn the daemon's death cut off.
    pub fn turn_open(&self) -> bool {
        self.items
            .iter()
            .rev()
            .find(|i| i.is(ItemKind::TurnStarted) || i.is(ItemKind::TurnEnded))
            .is_some_and(|i| i.is(ItemKind::TurnStarted))
    }

    /// Appends a new item and returns it (with its seq).
    pub fn push(
        &mut self,
        kind: &str,
        data: Map<String, Value>,
    ) -> Result<TimelineItem, StoreError> {
        let item = TimelineItem {
            seq: self.next_seq,
            at: Timestamp::now(),
            kind: kind.to_string(),
            data,
            updated_at: None,
        };
        self.write(&Entry::Item { item: item.clone() })?;
        self.next_seq += 1;
        self.index.insert(item.seq, self.items.len());
        self.items.push(item.clone());
        Ok(item)
    }

    /// [`Timeline::push`] of an item stamped `at`, fsynced before it returns (with everything
    /// appended before it): the record that makes a message delivered (see [`crate::inbox`]). On failure nothing
    /// of it stays in the log.
    pub fn push_synced(
        &mut self,
        kind: &str,
        data: Map<String, Value>,
        at: Timestamp,
    ) -> Result<TimelineItem, StoreError> {
        let item = TimelineItem {
            seq: self.next_seq,
            at,
            kind: kind.to_string(),
            data,
            updated_at: None,
        };
        self.log
            .append_synced(&Entry::Item { item: item.clone() })?;
        self.revision += 1;
        self.next_seq += 1;
        self.index.insert(item.seq, self.items.len());
        self.items.push(item.clone());
        Ok(item)
    }

    /// The ids of every inbox message this timeline records as delivered: the `messageId`
    /// and `contextIds` of its `user_message` items.
    pub fn delivered(&self) -> HashSet<String> {
        let mut ids = HashSet::new();
        for item in &self.items {
            add_delivered(&mut ids, item);
        }
        ids
    }

    /// [`Timeline::delivered`] of the timeline on disk, without opening it for writing.
    pub fn read_delivered(home: &Path, agent: AgentId) -> Result<HashSet<String>, StoreError> {
        let mut ids = HashSet::new();
        jsonl::read(&Self::path_for(home, agent), |entry| {
            if let Entry::Item { item } = entry {
                add_delivered(&mut ids, &item);
            }
        })?;
        Ok(ids)
    }

    /// Appends `text` to a string field of item `seq` (streamed chunks).
    pub fn append_text(&mut self, seq: u64, field: &str, text: &str) -> Result<(), StoreError> {
        if !self.index.contains_key(&seq) {
            return Ok(());
        }
        self.write(&Entry::Append {
            seq,
            field: field.to_string(),
            text: text.to_string(),
        })?;
        if let Some(i) = self.index.get(&seq) {
            apply_append(&mut self.items[*i], field, text);
        }
        Ok(())
    }

    /// Merges `fields` into item `seq` (a tool call update, a resolved permission) and stamps
    /// it `updatedAt`; returns that time, for the live update.
    pub fn patch(
        &mut self,
        seq: u64,
        fields: Map<String, Value>,
    ) -> Result<Option<Timestamp>, StoreError> {
        if !self.index.contains_key(&seq) || fields.is_empty() {
            return Ok(None);
        }
        let at = Some(Timestamp::now());
        self.write(&Entry::Patch {
            seq,
            fields: fields.clone(),
            at,
        })?;
        if let Some(i) = self.index.get(&seq) {
            apply_patch(&mut self.items[*i], fields, at);
        }
        Ok(at)
    }

    /// Makes everything appended so far durable against a machine crash.
    pub fn sync(&mut self) -> Result<(), StoreError> {
        self.log.sync()
    }

    fn write(&mut self, entry: &Entry) -> Result<(), StoreError> {
        self.log.append(entry)?;
        self.revision += 1;
        Ok(())
    }
}

fn add_delivered(ids: &mut HashSet<String>, item: &TimelineItem) {
    if !item.is(ItemKind::UserMessage) {
        return;
    }
    let context = item.data.get("contextIds").and_then(Value::as_array);
    let named = item
        .data
        .get("messageId")
        .into_iter()
        .chain(context.into_iter().flatten());
    ids.extend(named.filter_map(Value::as_str).map(str::to_string));
}

fn apply_append(item: &mut TimelineItem, field: &str, text: &str) {
    match item.data.get_mut(field) {
        Some(Value::String(s)) => s.push_str(text),
        _ => {
            item.data
                .insert(field.to_string(), Value::String(text.to_string()));
        }
    }
}

fn apply_patch(item: &mut TimelineItem, fields: Map<String, Value>, at: Option<Timestamp>) {
    if at.is_some() {
        item.updated_at = at;
    }
    for (k, v) in fields {
        if v.is_null() {
            continue;
        }
        item.data.insert(k, v);
    }
}

/// A log folded into items, as it replays.
#[derive(Default)]
struct Fold {
    items: Vec<TimelineItem>,
    /// seq → index in `items`.
    index: HashMap<u64, usize>,
}

impl Fold {
    fn apply(&mut self, entry: Entry) {
        match entry {
            Entry::Item { item } => {
                self.index.insert(item.seq, self.items.len());
                self.items.push(item);
            }
            Entry::Append { seq, field, text } => {
                if let Some(i) = self.index.get(&seq) {
                    apply_append(&mut self.items[*i], &field, &text);
                }
            }
            Entry::Patch { seq, fields, at } => {
                if let Some(i) = self.index.get(&seq) {
                    apply_patch(&mut self.items[*i], fields, at);
                }
            }
        }
    }
}

fn paginate(items: &[TimelineItem], page: Page, revision: u64) -> TimelinePage {
    let (start, end) = match page {
        Page::Tail { limit } => (items.len().saturating_sub(limit), items.len()),
        Page::Before { seq, limit } => {
            let end = items.partition_point(|i| i.seq < seq);
            (end.saturating_sub(limit), end)
        }
        Page::After { seq, limit } => {
            let start = items.partition_point(|i| i.seq <= seq);
            (start, (start + limit).min(items.len()))
        }
    };
    TimelinePage {
        items: items[start..end].to_vec(),
        has_older: start > 0,
        has_newer: end < items.len(),
        revision,
    }
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;
    use std::io::Write;

    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        if let Value::Object(map) = v {
            map
        } else {
            Map::new()
        }
    }

    #[test]
    fn folds_appends_and_patches_and_survives_reopen() {
        let home = tempfile::tempdir().expect("home");
        let agent = AgentId::new();
        let mut t = Timeline::open(home.path(), agent).expect("open");
        let msg = t
            .push("agent_message", obj(json!({"text": "Hel"})))
            .expect("push");
        t.append_text(msg.seq, "text", "lo").expect("append");
        let tool = t
            .push(
                "tool_call",
                obj(json!({"toolCallId": "t1", "status": "pending"})),
            )
            .expect("push");
        let patched = t
            .patch(tool.seq, obj(json!({"status": "completed"})))
            .expect("patch");
        assert!(patched.is_some_and(|at| at >= tool.at));
        drop(t);
        let t = Timeline::open(home.path(), agent).expect("reopen");
        assert_eq!(t.items().len(), 2);
        assert_eq!(t.items()[0].data["text"], "Hello");
        assert_eq!(t.items()[0].updated_at, None, "never patched");
        assert_eq!(t.items()[1].data["status"], "completed");
        assert_eq!(t.items()[1].updated_at, patched, "dated by its last change");
        assert_eq!(t.last().map(|i| i.seq), Some(2));
    }

    #[test]
    fn a_patch_from_an_older_drover_has_no_time_and_still_applies() {
        let home = tempfile::tempdir().expect("home");
        let agent = AgentId::new();
        let mut t = Timeline::open(home.path(), agent).expect("open");
        let tool = t
            .push("tool_call", obj(json!({"status": "pending"})))
            .expect("push");
        drop(t);
        let mut f = OpenOptions::new()
            .append(true)
            .open(Timeline::path_for(home.path(), agent))
            .expect("open raw");
        writeln!(
            f,
            r#"{{"op":"patch","seq":{},"fields":{{"status":"failed"}}}}"#,
            tool.seq
        )
        .expect("write");
        drop(f);
        let page = Timeline::read_page(home.path(), agent, Page::Tail { limit: 10 }).expect("read");
        assert_eq!(page.items[0].data["status"], "failed");
        assert_eq!(page.items[0].updated_at, None);
    }

    #[test]
    fn a_torn_last_line_is_cut_and_seq_continues() {
        let home = tempfile::tempdir().expect("home");
        let agent = AgentId::new();
        let mut t = Timeline::open(home.path(), agent).expect("open");
        t.push("notice", obj(json!({"text": "one"}))).expect("push");
        drop(t);
        let path = Timeline::path_for(home.path(), agent);
        let mut f = OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open raw");
        f.write_all(br#"{"op":"item","item":{"seq":2,"at":"#)
            .expect("torn write");
        drop(f);
        let page = Timeline::read_page(home.path(), agent, Page::Tail { limit: 10 }).expect("read");
        assert_eq!(page.items.len(), 1);
        let mut t = Timeline::open(home.path(), agent).expect("reopen");
        let two = t.push("notice", obj(json!({"text": "two"}))).expect("push");
        assert_eq!(two.seq, 2);
        drop(t);
        let page = Timeline::read_page(home.path(), agent, Page::Tail { limit: 10 }).expect("read");
        assert_eq!(
            page.items.iter().map(|i| i.seq).collect::<Vec<_>>(),
            vec![1, 2]
        );
    }

    #[test]
    fn pages() {
        let home = tempfile::tempdir().expect("home");
        let agent = AgentId::new();
        let mut t = Timeline::open(home.path(), agent).expect("open");
        for i in 0..10 {
            t.push("notice", obj(json!({ "n": i }))).expect("push");
        }
        let tail = t.page(Page::Tail { limit: 3 });
        assert_eq!(
            tail.items.iter().map(|i| i.seq).collect::<Vec<_>>(),
            vec![8, 9, 10]
        );
        assert!(tail.has_older && !tail.has_newer);
        let before = t.page(Page::Before { seq: 8, limit: 3 });
        assert_eq!(
            before.items.iter().map(|i| i.seq).collect::<Vec<_>>(),
            vec![5, 6, 7]
        );
        let after = t.page(Page::After { seq: 2, limit: 2 });
        assert_eq!(
            after.items.iter().map(|i| i.seq).collect::<Vec<_>>(),
            vec![3, 4]
        );
        assert!(after.has_older && after.has_newer);
    }
}
