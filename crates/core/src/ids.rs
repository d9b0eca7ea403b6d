//! Agent and workspace identifiers: `UUIDv7` (sortable by creation time), validated on parse.
//!
//! Ids reach file names, so nothing that is not a canonical `UUIDv7` is ever accepted as one.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

/// Why a string is not a valid id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{value}` is not a valid {kind} id (expected a UUIDv7 such as 0193b1c2-7d4e-7a10-8000-000000000000)"
)]
pub struct InvalidId {
    pub kind: &'static str,
    pub value: String,
}

fn parse_v7(kind: &'static str, s: &str) -> Result<Uuid, InvalidId> {
    let invalid = || InvalidId {
        kind,
        value: s.chars().take(80).collect(),
    };
    // Only the hyphenated lower-case form: it is the one we write, and it keeps one id one
    // file name.
    if s.len() != 36 || s.bytes().any(|b| b.is_ascii_uppercase()) {
        return Err(invalid());
    }
    let uuid = Uuid::parse_str(s).map_err(|_| invalid())?;
    if uuid.get_version_num() != 7 {
        return Err(invalid());
    }
    Ok(uuid)
}

macro_rules! define_id {
    ($(#[$meta:meta])* $name:ident, $kind:literal) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh id; ids made later sort after ids made earlier.
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }

            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl FromStr for $name {
            type Err = InvalidId;
            fn from_str(s: &str) -> Result<Self, InvalidId> {
                parse_v7($kind, s).map(Self)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0.hyphenated(), f)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({})", stringify!($name), self.0.hyphenated())
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

define_id!(
    /// Identifies one agent for its whole life, archived or not.
    AgentId,
    "agent"
);
define_id!(
    /// Identifies one registered workspace. Opaque: never derived from a path.
    WorkspaceId,
    "workspace"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_canonical_v7() {
        let id = AgentId::new();
        assert_eq!(id.to_string().parse::<AgentId>(), Ok(id));
        for bad in [
            "",
            "../../etc/passwd",
            "not-a-uuid",
            // v4
            "3f0c5f9e-8f1b-4c7a-9d2e-1a2b3c4d5e6f",
            // upper case
            &id.to_string().to_uppercase(),
            // simple (no hyphens)
            &id.as_uuid().simple().to_string(),
        ] {
            let err = bad.parse::<AgentId>().expect_err(bad);
            assert!(err.to_string().contains("not a valid agent id"), "{err}");
        }
    }

    #[test]
    fn later_ids_sort_after_earlier_ones() {
        let a = WorkspaceId::new();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = WorkspaceId::new();
        assert!(a < b);
    }
}
