//! The providers agents can be created with, whether each is available here and signed in,
//! and signing one in.

use std::collections::BTreeMap;

use drover_acp::Availability;
use drover_acp::auth::SignInState;
use drover_core::{AgentId, AuthMethod};

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
    /// As its agents' last starts saw it (`None`: none started since the daemon did).
    pub(crate) sign_in: Option<SignInState>,
    pub(crate) methods: Vec<AuthMethod>,
    /// How to sign it in, for people.
    pub(crate) how: String,
    /// Its warm spares: ready, and wanted (`warm`).
    pub(crate) warm: drover_acp::warm::WarmCount,
}

impl Ops {
    /// The `[runtimes] max_live` ceiling (`None`: none), as `welcome` tells clients.
    pub(crate) fn max_live(&self) -> Option<u32> {
        self.runtimes
            .runtime_settings()
            .max_live
            .and_then(|n| u32::try_from(n).ok())
    }

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
                let (sign_in, methods, how) = self.runtimes.sign_in_status(p);
                ProviderView {
                    name: p.name.clone(),
                    label: p.label.clone(),
                    command: p.command.clone(),
                    available,
                    detail,
                    sign_in,
                    methods,
                    how,
                    warm: self.runtimes.warm(p),
                }
            })
            .collect())
    }

    /// Every provider, as [`Ops::list_providers`]; first, when `ask` names one whose sign-in
    /// methods the daemon does not know, its agent is started once to ask them.
    pub(crate) async fn list_providers_asking(
        &self,
        ask: Option<&str>,
    ) -> Result<Vec<ProviderView>, OpError> {
        if let Some(provider) = ask {
            self.runtimes.sign_in_methods(provider).await?;
        }
        self.list_providers()
    }

    /// Signs `provider` in with `method_id` (an `env_var` method's `vars` are kept in
    /// `config.toml`), then starts again its agents that wait for a sign-in; returns them.
    pub(crate) async fn sign_in(
        &self,
        provider: &str,
        method_id: &str,
        vars: BTreeMap<String, String>,
    ) -> Result<Vec<AgentId>, OpError> {
        if method_id.trim().is_empty() {
            return Err(OpError::invalid(
                "methodId",
                "give one of the provider's sign-in methods (`drover providers` lists them)",
            ));
        }
        Ok(self.runtimes.sign_in(provider, method_id, vars).await?)
    }
}
