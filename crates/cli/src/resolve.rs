//! Naming agents on the command line: a full id, a unique prefix of it (with or without the
//! hyphens), or an exact title; and the shortest prefixes that tell the known agents apart.

use std::collections::HashMap;

use drover_protocol::AgentInfo;

use crate::error::CliError;

/// Shortest prefixes never go below this many characters.
const MIN_PREFIX: usize = 8;

/// Which agent wins when a prefix or title matches several and only one of them is in the
/// preferred state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefer {
    /// Agents that are not archived (what `drover ls` shows).
    Live,
    /// Archived agents (`drover unarchive`).
    Archived,
}

/// The agent `query` names among `agents` (archived ones included, so archived agents can be
/// named too).
pub fn resolve<'a>(
    agents: &'a [AgentInfo],
    query: &str,
    prefer: Prefer,
) -> Result<&'a AgentInfo, CliError> {
    if let Some(agent) = agents.iter().find(|a| a.id == query) {
        return Ok(agent);
    }
    let query_lower = query.to_ascii_lowercase();
    let simple_query = query_lower.replace('-', "");
    let is_prefix = |id: &str| {
        !query.is_empty()
            && (id.starts_with(&query_lower)
                || (!query.contains('-')
                    && query.chars().all(|c| c.is_ascii_hexdigit())
                    && id.replace('-', "").starts_with(&simple_query)))
    };
    let matches: Vec<&AgentInfo> = agents
        .iter()
        .filter(|a| is_prefix(&a.id) || a.title.as_deref() == Some(query))
        .collect();
    let preferred: Vec<&AgentInfo> = matches
        .iter()
        .copied()
        .filter(|a| a.archived_at.is_none() == (prefer == Prefer::Live))
        .collect();
    if matches.len() > 1
        && let [one] = preferred.as_slice()
    {
        return Ok(one);
    }
    match matches.as_slice() {
        [one] => Ok(one),
        [] => Err(CliError::UnknownAgent(query.to_string())),
        many => {
            let short = ShortIds::new(agents);
            let candidates = many
                .iter()
                .map(|a| {
                    format!(
                        "  {}  {}  {}{}",
                        short.get(&a.id),
                        a.title.as_deref().unwrap_or("-"),
                        a.status,
                        if a.archived_at.is_some() {
                            " (archived)"
                        } else {
                            ""
                        }
                    )
                })
                .collect();
            Err(CliError::Ambiguous {
                query: query.to_string(),
                candidates,
            })
        }
    }
}

/// For each id, its shortest prefix (at least [`MIN_PREFIX`] characters) that no other id
/// shares. Ids are UUIDv7, so ids made close in time share their leading characters.
#[derive(Debug, Default)]
pub struct ShortIds {
    lengths: HashMap<String, usize>,
}

impl ShortIds {
    pub fn new(agents: &[AgentInfo]) -> ShortIds {
        let mut ids: Vec<&str> = agents.iter().map(|a| a.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        let common =
            |a: &str, b: &str| a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        let mut lengths = HashMap::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            let before = if i > 0 { common(ids[i - 1], id) } else { 0 };
            let after = ids.get(i + 1).map_or(0, |next| common(id, next));
            let mut len = (before.max(after) + 1).max(MIN_PREFIX).min(id.len());
            // Never end on a hyphen.
            if id.as_bytes().get(len - 1) == Some(&b'-') {
                len = (len + 1).min(id.len());
            }
            lengths.insert(id.to_string(), len);
        }
        ShortIds { lengths }
    }

    /// The short form of `id` (the whole id if it is not one of the known agents).
    pub fn get<'a>(&self, id: &'a str) -> &'a str {
        match self.lengths.get(id) {
            Some(len) => &id[..*len],
            None => &id[..id.len().min(MIN_PREFIX)],
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
            status: "idle".to_string(),
            created_at: String::new(),
            updated_at: String::new(),
            last_activity_at: String::new(),
            provider: "scripted".to_string(),
            session_id: None,
            error: None,
            current_mode_id: None,
            available_modes: None,
            model: None,
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
            permission_policy: Default::default(),
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
    fn short_ids_are_unique_and_never_end_on_a_hyphen() {
        let agents = vec![agent(A, None), agent(B, None), agent(C, None)];
        let short = ShortIds::new(&agents);
        assert_eq!(short.get(A), "0193b1c2-7d4e-7a10-8");
        assert_eq!(short.get(B), "0193b1c2-7d4e-7a10-9");
        assert_eq!(short.get(C), "0194aaaa");
        let lone = ShortIds::new(&agents[..1]);
        assert_eq!(lone.get(A), "0193b1c2");
    }
}
