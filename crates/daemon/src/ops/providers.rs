//! The providers agents can be created with, and whether each is available here.

use drover_acp::Availability;

use super::{OpError, Ops};

/// A provider as clients see it.
#[derive(Debug)]
pub(crate) struct ProviderView {
    pub(crate) name: String,
    pub(crate) label: String,
    pub(crate) command: Vec<String>,
    pub(crate) available: bool,
    /// Where its command was found, or why it is unavailable.
    pub(crate) detail: String,
}

impl Ops {
    /// Every provider as `config.toml` says now (an edit takes effect without a restart).
    pub(crate) fn list_providers(&self) -> Result<Vec<ProviderView>, OpError> {
        let providers = self.runtimes.providers()?;
        Ok(providers
            .all()
            .map(|p| {
                let (available, detail) = match providers.availability(p) {
                    Availability::Available { path } => (true, path.display().to_string()),
                    Availability::Unavailable { reason } => (false, reason),
                };
                ProviderView {
                    name: p.name.clone(),
                    label: p.label.clone(),
                    command: p.command.clone(),
                    available,
                    detail,
                }
            })
            .collect())
    }
}
