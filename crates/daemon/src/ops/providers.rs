//! The providers agents can be created with, and whether each is available here.

use drover_acp::Availability;

use super::Ops;

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
    pub(crate) fn list_providers(&self) -> Vec<ProviderView> {
        let providers = self.runtimes.providers();
        providers
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
            .collect()
    }
}
