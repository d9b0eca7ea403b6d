//! Naming agents and workspaces on the command line: a full id, a unique prefix or suffix of
//! it (with or without the hyphens), or an exact title (for a workspace, its name or path);
//! and the short handle each is shown by.
//!
//! Ids are `UUIDv7`: their leading characters are a timestamp, shared by agents made close
//! together, and their last ones are random. So the handle is the end of the id (its last
//! [`HANDLE`] hex digits, more only if two known agents share them), which stays the same as
//! more agents are created.

use std::collections::HashMap;

use drover_protocol::{AgentInfo, WorkspaceInfo};

use crate::error::CliError;

/// Handles are this many characters: 32 random bits.
const HANDLE: usize = 8;

/// Which agent wins when a prefix or title matches several and only one of them is in the
/// preferred state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefer {
    /// Agents that are not archived (what `drover ls` shows).
    Live,
    /// Archived agents (`drover unarchive`).
    Archived,
}

/// Whether `query` names `id` by a prefix or a suffix: as written, or hex digits only (the
/// hyphens left out).
pub fn abbreviates(id: &str, query: &str) -> bool {
    if query.is_empty() {
        return false;
    }
    let query = query.to_ascii_lowercase();
    if id.starts_with(&query) || id.ends_with(&query) {
        return true;
    }
    if query.contains('-') || !query.chars().all(|c| c.is_ascii_hexdigit()) {
        return false;
    }
    let simple = id.replace('-', "");
    simple.starts_with(&query) || simple.ends_with(&query)
}

/// The agent `query` names among `agents` (archived ones included, so archived agents can be
/// named too).
pub fn resolve<'a>(
    agents: &'a [AgentInfo],
    query: &str,
    prefer: Prefer,
) -> Result<&'a AgentInfo, CliError> {
    let found = pick(
        agents,
        query,
        prefer,
        |a| &a.id,
        |a| a.title.as_deref() == Some(query),
        |a| a.archived_at.is_some(),
    );
    match found {
        Ok(agent) => Ok(agent),
        Err(many) if many.is_empty() => Err(CliError::UnknownAgent(query.to_string())),
        Err(many) => {
            let short = ShortIds::new(agents);
            let candidates = many
                .iter()
                .map(|a| {
                    format!(
                        "  {}  {}  {}{}",
                        short.get(&a.id),
                        a.title.as_deref().unwrap_or("-"),
                        a.status,
                        archived_note(a.archived_at.is_some())
                    )
                })
                .collect();
            Err(CliError::Ambiguous {
                query: query.to_string(),
                what: "agents",
                candidates,
            })
        }
    }
}

/// The workspace `query` names: a full id, a unique prefix or suffix of it, an exact name, or
/// its path (as written, or the directory it names here).
pub fn resolve_workspace<'a>(
    workspaces: &'a [WorkspaceInfo],
    query: &str,
    prefer: Prefer,
) -> Result<&'a WorkspaceInfo, CliError> {
    let here = std::fs::canonicalize(query)
        .ok()
        .map(|p| p.display().to_string());
    let found = pick(
        workspaces,
        query,
        prefer,
        |w| &w.id,
        |w| w.name == query || w.path == query || here.as_deref() == Some(w.path.as_str()),
        |w| w.archived_at.is_some(),
    );
    match found {
        Ok(workspace) => Ok(workspace),
        Err(many) if many.is_empty() => Err(CliError::UnknownWorkspace(query.to_string())),
        Err(many) => {
            let ids: Vec<&str> = workspaces.iter().map(|w| w.id.as_str()).collect();
            let short = ShortIds::of(&ids);
            let candidates = many
                .iter()
                .map(|w| {
                    format!(
                        "  {}  {}  {}{}",
                        short.get(&w.id),
                        w.name,
                        w.path,
                        archived_note(w.archived_at.is_some())
                    )
                })
                .collect();
            Err(CliError::Ambiguous {
                query: query.to_string(),
                what: "workspaces",
                candidates,
            })
        }
    }
}

fn archived_note(archived: bool) -> &'static str {
    if archived { " (archived)" } else { "" }
}

/// The one item `query` names: by its full id, else by an abbreviation of it or `named`; when
/// several match and only one is in the preferred state, that one. Otherwise the matches
/// (none, or too many).
fn pick<'a, T>(
    items: &'a [T],
    query: &str,
    prefer: Prefer,
    id: impl Fn(&T) -> &str,
    named: impl Fn(&T) -> bool,
    archived: impl Fn(&T) -> bool,
) -> Result<&'a T, Vec<&'a T>> {
    if let Some(item) = items.iter().find(|i| id(i) == query) {
        return Ok(item);
    }
    let matches: Vec<&T> = items
        .iter()
        .filter(|i| abbreviates(id(i), query) || named(i))
        .collect();
    let preferred: Vec<&T> = matches
        .iter()
        .copied()
        .filter(|i| archived(i) == (prefer == Prefer::Archived))
        .collect();
    if matches.len() > 1
        && let [one] = preferred.as_slice()
    {
        return Ok(one);
    }
    match matches.as_slice() {
        [one] => Ok(one),
        _ => Err(matches),
    }
}

/// For each id, its handle: its shortest suffix (at least [`HANDLE`] characters) that no
/// other id ends with.
#[derive(Debug, Default)]
pub struct ShortIds {
    lengths: HashMap<String, usize>,
}

impl ShortIds {
    pub fn new(agents: &[AgentInfo]) -> ShortIds {
        let ids: Vec<&str> = agents.iter().map(|a| a.id.as_str()).collect();
        ShortIds::of(&ids)
    }

    /// Handles for any ids (agents, workspaces).
    pub fn of(ids: &[&str]) -> ShortIds {
        // Sorted by their reversed text, ids sharing an ending are neighbours.
        let mut reversed: Vec<String> = ids.iter().map(|id| id.chars().rev().collect()).collect();
        reversed.sort_unstable();
        reversed.dedup();
        let common =
            |a: &str, b: &str| a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        let mut lengths = HashMap::with_capacity(reversed.len());
        for (i, rev) in reversed.iter().enumerate() {
            let before = if i > 0 {
                common(&reversed[i - 1], rev)
            } else {
                0
            };
            let after = reversed.get(i + 1).map_or(0, |next| common(rev, next));
            let mut len = (before.max(after) + 1).max(HANDLE).min(rev.len());
            // Never start on a hyphen.
            if rev.as_bytes().get(len - 1) == Some(&b'-') {
                len = (len + 1).min(rev.len());
            }
            lengths.insert(rev.chars().rev().collect(), len);
        }
        ShortIds { lengths }
    }

    /// The handle of `id` (its last [`HANDLE`] characters if it is not one of the known ids).
    pub fn get<'a>(&self, id: &'a str) -> &'a str {
        let len = self
            .lengths
            .get(id)
            .copied()
            .unwrap_or(HANDLE)
            .min(id.len());
        match id.get(id.len() - len..) {
            Some(handle) => handle,
            None => id,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn agent(id: &str, title: Option<&str>) -> AgentInfo {
        AgentInfo {
            id: id.to_string(),
            status: drover_protocol::AgentStatus::Idle,
            created_at: String::new(),
            updated_at: String::new(),
            last_activity_at: String::new(),
            provider: "scripted".to_string(),
            session_id: None,
            error: None,
            current_mode_id: None,
            available_modes: None,
            model: None,
            effort: None,
            config_options: None,
            own_subagents: Vec::new(),
            title: title.map(str::to_string),
            cwd: "/".to_string(),
            parent_agent_id: None,
            workspace_id: String::new(),
            labels: BTreeMap::new(),
            archived_at: None,
            requires_attention: false,
            attention_reason: None,
            attention_timestamp: None,
            auto_archive: false,
            permission_policy: drover_protocol::PermissionPolicy::default(),
            on_interrupt: None,
            on_limit: None,
            limited: None,
            spend: drover_protocol::SpendInfo::default(),
            budget: None,
            tree_spend: None,
            runtime: drover_protocol::RuntimeInfo::default(),
            start_failure: None,
            queued: None,
            host: None,
        }
    }

    const A: &str = "0193b1c2-7d4e-7a10-8000-000000000001";
    const B: &str = "0193b1c2-7d4e-7a10-9000-000000000002";
    const C: &str = "0194aaaa-0000-7000-8000-000000000003";

    #[test]
    fn ids_prefixes_and_titles_resolve() {
        let agents = vec![
            agent(A, Some("fix")),
            agent(B, Some("same")),
            agent(C, Some("same")),
        ];
        assert_eq!(
            resolve(&agents, A, Prefer::Live)
                .ok()
                .map(|a| a.id.as_str()),
            Some(A)
        );
        assert_eq!(
            resolve(&agents, "0194", Prefer::Live)
                .ok()
                .map(|a| a.id.as_str()),
            Some(C)
        );
        assert_eq!(
            resolve(&agents, "0193b1c27d4e7a108", Prefer::Live)
                .ok()
                .map(|a| a.id.as_str()),
            Some(A)
        );
        assert_eq!(
            resolve(&agents, "fix", Prefer::Live)
                .ok()
                .map(|a| a.id.as_str()),
            Some(A)
        );
        // A suffix, with or without hyphens.
        assert_eq!(
            resolve(&agents, "000000000002", Prefer::Live)
                .ok()
                .map(|a| a.id.as_str()),
            Some(B)
        );
        assert_eq!(
            resolve(&agents, "a10-8000-000000000001", Prefer::Live)
                .ok()
                .map(|a| a.id.as_str()),
            Some(A)
        );
        assert_eq!(
            resolve(&agents, "70008000000000000003", Prefer::Live)
                .ok()
                .map(|a| a.id.as_str()),
            Some(C)
        );
        assert!(matches!(
            resolve(&agents, "0193b1c2", Prefer::Live),
            Err(CliError::Ambiguous { .. })
        ));
        assert!(matches!(
            resolve(&agents, "same", Prefer::Live),
            Err(CliError::Ambiguous { .. })
        ));
        assert!(matches!(
            resolve(&agents, "nope", Prefer::Live),
            Err(CliError::UnknownAgent(_))
        ));
    }

    #[test]
    fn a_tie_goes_to_the_preferred_state() {
        let mut archived = agent(C, Some("same"));
        archived.archived_at = Some("2025-01-01T00:00:00Z".to_string());
        let agents = vec![agent(B, Some("same")), archived];
        let pick = |prefer| resolve(&agents, "same", prefer).ok().map(|a| a.id.as_str());
        assert_eq!(pick(Prefer::Live), Some(B));
        assert_eq!(pick(Prefer::Archived), Some(C));
        assert_eq!(
            resolve(&agents, "01", Prefer::Live)
                .ok()
                .map(|a| a.id.as_str()),
            Some(B)
        );
    }

    #[test]
    fn handles_are_unique_suffixes_and_never_start_on_a_hyphen() {
        const D: &str = "0194aaaa-0000-7000-8001-000000000003";
        let agents = vec![agent(A, None), agent(B, None), agent(C, None)];
        let short = ShortIds::new(&agents);
        assert_eq!(short.get(A), "00000001");
        assert_eq!(short.get(B), "00000002");
        assert_eq!(short.get(C), "00000003");
        // Two ids ending alike: longer handles, never starting on a hyphen.
        let twins = ShortIds::new(&[agent(C, None), agent(D, None)]);
        assert_eq!(twins.get(C), "0-000000000003");
        assert_eq!(twins.get(D), "1-000000000003");
        assert_eq!(ShortIds::default().get(A), "00000001");
    }

    fn workspace(id: &str, name: &str, path: &str, archived: bool) -> WorkspaceInfo {
        WorkspaceInfo {
            id: id.to_string(),
            kind: drover_protocol::WorkspaceKind::Worktree,
            path: path.to_string(),
            name: name.to_string(),
            created_at: String::new(),
            archived_at: archived.then(|| "2025-01-01T00:00:00Z".to_string()),
            activity: None,
            worktree: None,
            host: None,
        }
    }

    #[test]
    fn workspaces_resolve_by_id_handle_name_and_path() {
        let workspaces = vec![
            workspace(A, "parser", "/w/repo/parser", false),
            workspace(B, "docs", "/w/repo/docs", false),
            workspace(C, "parser", "/w/repo/parser-2", true),
        ];
        let pick = |q: &str| {
            resolve_workspace(&workspaces, q, Prefer::Live)
                .ok()
                .map(|w| w.id.as_str())
        };
        assert_eq!(pick(B), Some(B));
        assert_eq!(pick("00000002"), Some(B));
        assert_eq!(pick("docs"), Some(B));
        assert_eq!(pick("/w/repo/parser-2"), Some(C));
        // The live one wins a tie on the name.
        assert_eq!(pick("parser"), Some(A));
        assert!(matches!(
            resolve_workspace(&workspaces, "0193b1c2", Prefer::Live),
            Err(CliError::Ambiguous {
                what: "workspaces",
                ..
            })
        ));
        assert!(matches!(
            resolve_workspace(&workspaces, "nope", Prefer::Live),
            Err(CliError::UnknownWorkspace(_))
        ));
    }

    #[test]
    fn a_handle_stays_the_same_as_agents_made_in_the_same_millisecond_come() {
        // UUIDv7 ids of one millisecond: the same first 12 hex digits.
        let ids: Vec<String> = (0..200u32)
            .map(|i| {
                let random = (u64::from(i) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                format!(
                    "0193b1c2-7d4e-7{:03x}-8{:03x}-{:012x}",
                    i % 0x1000,
                    (random >> 52) & 0xfff,
                    random & 0xffff_ffff_ffff
                )
            })
            .collect();
        let first = ShortIds::of(&[ids[0].as_str()]).get(&ids[0]).to_string();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let all = ShortIds::of(&refs);
        assert_eq!(all.get(&ids[0]), first);
        let agents: Vec<AgentInfo> = ids.iter().map(|id| agent(id, None)).collect();
        for id in &ids {
            let handle = all.get(id);
            assert_eq!(handle.len(), 8, "{id}");
            let found = resolve(&agents, handle, Prefer::Live).map(|a| a.id.as_str());
            assert_eq!(found.ok(), Some(id.as_str()), "{handle}");
        }
    }
}
