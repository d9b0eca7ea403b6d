//! A provider's sign-in as the daemon knows it, and signing it in: the chosen method kept in
//! `config.toml`, then every agent waiting for it started again.

use std::collections::BTreeMap;

use crate::providers::{self, Provider};
use crate::{AcpError, RuntimeManager, auth};
use drover_core::AgentId;

impl RuntimeManager {
    /// A provider's sign-in as the daemon knows it: the state its agents' last starts saw
    /// (`None`: none started since the daemon did), the methods it offered, and what to tell
    /// people.
    pub fn sign_in_status(
        &self,
        provider: &Provider,
    ) -> (
        Option<auth::SignInState>,
        Vec<drover_core::AuthMethod>,
        String,
    ) {
        let state = self
            .shared
            .sign_ins
            .get(&provider.name)
            .map(|(state, _)| state)
            .or_else(|| {
                self.recorded_methods(&provider.name)
                    .map(|_| auth::SignInState::NeedsSignIn)
            });
        let methods = self.known_methods(&provider.name).unwrap_or_default();
        let how = auth::how_to_sign_in(provider, &methods);
        (state, methods, how)
    }

    /// The methods `provider` offers as the daemon knows them (an empty list: it offers
    /// none): what its agents' last start saw, else what its agent said when asked alone,
    /// else what an agent of it waiting for a sign-in recorded; `None`: not known.
    fn known_methods(&self, provider: &str) -> Option<Vec<drover_core::AuthMethod>> {
        self.shared
            .sign_ins
            .get(provider)
            .map(|(_, methods)| methods)
            .or_else(|| self.shared.sign_ins.offered(provider))
            .or_else(|| self.recorded_methods(provider))
    }

    /// The methods recorded with an agent of `provider` that waits for a sign-in.
    fn recorded_methods(&self, provider: &str) -> Option<Vec<drover_core::AuthMethod>> {
        self.registry().agents().iter().find_map(|a| {
            (a.provider == provider && !a.is_archived())
                .then(|| a.start_failure.as_ref()?.sign_in.clone())
                .flatten()
        })
    }

    /// The sign-in methods `provider` offers (an empty list: none): as the daemon knows them,
    /// else, when none of its agents started since the daemon did, asked of its agent started
    /// once as the daemon starts it, and not asked again (`drover login` asks this before it
    /// signs in, so the `sign_in` after it starts no agent of its own).
    pub async fn sign_in_methods(
        &self,
        provider_name: &str,
    ) -> Result<Vec<drover_core::AuthMethod>, AcpError> {
        if let Some(methods) = self.known_methods(provider_name) {
            return Ok(methods);
        }
        let offered = self.offered_sign_ins(provider_name).await?;
        self.shared
            .sign_ins
            .set_offered(provider_name, offered.clone());
        Ok(offered)
    }

    /// Signs `provider` in with `method_id` (see `ClientMessage::SignIn`): an `env_var`
    /// method's `vars` go into the provider's `env` in `config.toml`, an `agent` method
    /// becomes its `auth`, a `terminal` one (run by the user) needs nothing kept. Only a
    /// method the provider's agent offers, with its own variables, is kept: when no agent of
    /// it started since the daemon did, its agent is started once to ask (and what it offers,
    /// none included, is known from then on). Then every agent of
    /// the provider waiting for a sign-in starts again; their ids are returned.
    pub async fn sign_in(
        &self,
        provider_name: &str,
        method_id: &str,
        vars: BTreeMap<String, String>,
    ) -> Result<Vec<AgentId>, AcpError> {
        let providers = self.providers()?;
        if providers.get(provider_name).is_none() {
            return Err(AcpError::UnknownProvider {
                name: provider_name.to_string(),
                known: providers.all().map(|p| p.name.clone()).collect(),
            });
        }
        // What is kept is checked against what its agent offers.
        let methods = self.sign_in_methods(provider_name).await?;
        let invalid = |message: String| AcpError::InvalidSignIn { message };
        let Some(method) = methods.iter().find(|m| m.id == method_id) else {
            if methods.is_empty() {
                return Err(invalid(format!(
                    "{provider_name} offers no sign-in method over ACP: give it its key in \
                     config.toml ([providers.{provider_name}] env), or sign in with its own CLI"
                )));
            }
            let ids: Vec<&str> = methods.iter().map(|m| m.id.as_str()).collect();
            return Err(invalid(format!(
                "{provider_name} offers no sign-in method `{method_id}`; its methods are {}",
                ids.join(", ")
            )));
        };
        if method.kind != drover_protocol::AuthKind::EnvVar && !vars.is_empty() {
            return Err(invalid(format!(
                "sign-in `{method_id}` of {provider_name} takes no variables"
            )));
        }
        let entry = match method.kind {
            drover_protocol::AuthKind::EnvVar => {
                let missing: Vec<&str> = method
                    .vars
                    .iter()
                    .filter(|v| !v.optional && vars.get(&v.name).is_none_or(String::is_empty))
                    .map(|v| v.name.as_str())
                    .collect();
                if !missing.is_empty() {
                    return Err(invalid(format!(
                        "sign-in `{method_id}` of {provider_name} needs {}",
                        missing.join(", ")
                    )));
                }
                if let Some(extra) = vars
                    .keys()
                    .find(|k| !method.vars.iter().any(|v| &v.name == *k))
                {
                    return Err(invalid(format!(
                        "sign-in `{method_id}` of {provider_name} takes no variable `{extra}`"
                    )));
                }
                Some(providers::SignInEntry::Env(vars))
            }
            drover_protocol::AuthKind::Agent => {
                Some(providers::SignInEntry::Auth(method_id.to_string()))
            }
            drover_protocol::AuthKind::Terminal => None,
        };
        if let Some(entry) = entry {
            let home = self.shared.home.clone();
            let name = provider_name.to_string();
            tokio::task::spawn_blocking(move || providers::store_sign_in(&home, &name, &entry))
                .await
                .map_err(|_| AcpError::ShuttingDown)??;
        }
        let waiting: Vec<AgentId> = self
            .registry()
            .agents()
            .iter()
            .filter(|a| {
                a.provider == provider_name
                    && !a.is_archived()
                    && a.start_failure
                        .as_ref()
                        .is_some_and(|f| f.sign_in.is_some())
            })
            .map(|a| a.id)
            .collect();
        // The sign-in is kept: one agent that cannot start again (archived meanwhile, say)
        // keeps none of the others waiting.
        let mut started = Vec::with_capacity(waiting.len());
        for agent in waiting {
            match self.restart(agent).await {
                Ok(()) => started.push(agent),
                Err(e) => {
                    tracing::warn!(%agent, error = %e, "not started again after the sign-in");
                }
            }
        }
        Ok(started)
    }
}
