//! `GET /metrics`: the daemon in the Prometheus text format (version 0.0.4), behind the
//! client token. Encoded by `prometheus-client`.
//!
//! Two kinds of numbers, kept apart on purpose:
//! - **Counters and the turn histogram** are counted where the event happens: turns and
//!   streamed text by the agents' tasks (`drover_acp::metrics`), clients' bytes, drops and
//!   resyncs by the WebSocket sessions and the hub ([`ClientMetrics`]). Each is an atomic
//!   add (the histogram's observation takes its own short lock, once per turn).
//! - **Gauges that describe the fleet** (agents by status and attention, runtimes, inboxes,
//!   jobs, schedules, the agents' memory, the daemon's own process) are computed when scraped,
//!   by [`Fleet`], from the state the daemon already keeps in memory: one pass over the
//!   registry's agents under its read lock, the runtimes' census, the jobs' and schedules'
//!   tables. Nothing on a hot path keeps them up to date, so nothing there can drift or slow.
//!
//! A scrape reads `/proc` (the agents' process trees, the daemon's own stat), so it runs on a
//! blocking thread.

use jiff::Timestamp;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Registry, Unit};

use drover_core::{AgentStatus, AttentionReason};

use crate::schedules::Schedules;

/// The `Content-Type` of the answer.
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

const ATTENTION: [AttentionReason; 5] = [
    AttentionReason::Permission,
    AttentionReason::Error,
    AttentionReason::Finished,
    AttentionReason::Interrupted,
    AttentionReason::AuthRequired,
];

/// What the WebSocket sessions and the hub count (cheap to clone: the clones count together).
#[derive(Debug, Clone, Default)]
pub(crate) struct ClientMetrics {
    /// Sessions connected now.
    pub(crate) connected: Gauge,
    /// Bytes of protocol messages written to clients.
    pub(crate) sent_bytes: Counter,
    /// Events sessions fell behind on and never got (each then resyncs).
    pub(crate) dropped_events: Counter,
    /// `resync_required` sent to a session that fell behind.
    pub(crate) resyncs: Counter,
    /// Events the hub itself fell behind on (then every session resyncs).
    pub(crate) hub_dropped_events: Counter,
}

impl ClientMetrics {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "clients",
            "WebSocket clients connected now (web UI pages, CLI commands, scripts)",
            self.connected.clone(),
        );
        registry.register_with_unit(
            "client_sent",
            "Protocol messages written to clients, in bytes",
            Unit::Bytes,
            self.sent_bytes.clone(),
        );
        registry.register(
            "client_dropped_events",
            "Events a client fell behind on (its queue was full) and was not sent, summed over clients",
            self.dropped_events.clone(),
        );
        registry.register(
            "client_resyncs",
            "resync_required sent to a client that fell behind, summed over clients",
            self.resyncs.clone(),
        );
        registry.register(
            "hub_dropped_events",
            "Events the daemon's fan-out fell behind on; every client was told to resync",
            self.hub_dropped_events.clone(),
        );
    }
}

/// The daemon's metrics: its registry, encoded at each scrape.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
}

impl Metrics {
    pub(crate) fn new(fleet: Fleet, clients: &ClientMetrics) -> Metrics {
        let mut registry = Registry::default();
        // The process metrics keep their standard names (`process_*`), as every exporter has them.
        registry.register_collector(Box::new(OwnProcess {
            started_at: fleet.started_at,
        }));
        let drover = registry.sub_registry_with_prefix("drover");
        fleet.runtimes.metrics().register(drover);
        clients.register(drover);
        drover.register_collector(Box::new(fleet));
        Metrics { registry }
    }

    /// The exposition, as a scrape gets it. Reads `/proc`: call it off the async workers.
    pub(crate) fn encode(&self) -> String {
        let mut text = String::with_capacity(8 * 1024);
        // Writing into a String cannot fail; a collector's error would leave the text short.
        if let Err(e) =
            prometheus_client::encoding::prometheus_text::encode(&mut text, &self.registry)
        {
            tracing::warn!(error = %e, "cannot encode the metrics");
        }
        text
    }
}

/// The fleet at the moment of a scrape.
pub(crate) struct Fleet {
    pub(crate) registry: drover_core::Registry,
    pub(crate) runtimes: drover_acp::RuntimeManager,
    pub(crate) schedules: Schedules,
    pub(crate) started_at: Timestamp,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet").finish_non_exhaustive()
    }
}

/// What one pass over the registry's agents counts.
#[derive(Debug, Default)]
struct AgentCounts {
    by_status: [u64; AgentStatus::ALL.len()],
    archived: u64,
    attention: [u64; ATTENTION.len()],
    /// The earliest `attention.at` per reason.
    oldest: [Option<Timestamp>; ATTENTION.len()],
    /// What the agents (archived too) reported spending: tokens, and cost by currency.
    tokens: u64,
    cost: std::collections::BTreeMap<String, f64>,
    /// Agents that reported no spend at all (theirs is unknown, not zero).
    spend_unknown: u64,
}

impl AgentCounts {
    fn of(registry: &drover_core::Registry) -> AgentCounts {
        let mut counts = AgentCounts::default();
        registry.for_each_agent(|agent| {
            let spend = &agent.spend;
            counts.tokens += spend.tokens.unwrap_or(0);
            if let Some(cost) = spend.cost {
                let currency = spend.currency.clone().unwrap_or_default();
                *counts.cost.entry(currency).or_default() += cost;
            }
            if spend.is_unknown() {
                counts.spend_unknown += 1;
            }
            if agent.is_archived() {
                counts.archived += 1;
                return;
            }
            if let Some(i) = AgentStatus::ALL.iter().position(|s| *s == agent.status) {
                counts.by_status[i] += 1;
            }
            if let Some(attention) = agent.attention
                && let Some(i) = ATTENTION.iter().position(|r| *r == attention.reason)
            {
                counts.attention[i] += 1;
                if counts.oldest[i].is_none_or(|t| attention.at < t) {
                    counts.oldest[i] = Some(attention.at);
                }
            }
        });
        counts
    }

    fn unarchived(&self) -> u64 {
        self.by_status.iter().sum()
    }
}

fn gauge<'a>(
    encoder: &'a mut DescriptorEncoder,
    name: &'a str,
    help: &str,
    unit: Option<&'a Unit>,
) -> Result<prometheus_client::encoding::MetricEncoder<'a>, std::fmt::Error> {
    encoder.encode_descriptor(name, help, unit, MetricType::Gauge)
}

impl Collector for Fleet {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let agents = AgentCounts::of(&self.registry);
        encode_agents(&mut encoder, &agents)?;
        self.encode_runtimes(&mut encoder, agents.unarchived())?;
        self.encode_work(&mut encoder)
    }
}

/// Agents by status, archived, and by attention (with the longest wait).
fn encode_agents(
    encoder: &mut DescriptorEncoder,
    agents: &AgentCounts,
) -> Result<(), std::fmt::Error> {
    let now = Timestamp::now();

    let mut m = gauge(
        encoder,
        "agents",
        "Agents that are not archived, by status",
        None,
    )?;
    for (status, n) in AgentStatus::ALL.iter().zip(agents.by_status) {
        m.encode_family(&[("status", status.as_str())])?
            .encode_gauge(&n)?;
    }
    gauge(encoder, "agents_archived", "Archived agents", None)?.encode_gauge(&agents.archived)?;
    gauge(
        encoder,
        "spend_tokens",
        "Tokens the agents reported spending (archived ones too; unknown spend counts nothing)",
        None,
    )?
    .encode_gauge(&agents.tokens)?;
    let mut m = gauge(
        encoder,
        "spend_cost",
        "Cost the agents reported spending, by currency (archived ones too)",
        None,
    )?;
    for (currency, cost) in &agents.cost {
        m.encode_family(&[("currency", currency.as_str())])?
            .encode_gauge(cost)?;
    }
    gauge(
        encoder,
        "agents_spend_unknown",
        "Agents that reported no spend (theirs is unknown, not zero)",
        None,
    )?
    .encode_gauge(&agents.spend_unknown)?;

    let mut m = gauge(
        encoder,
        "agents_attention",
        "Agents that are not archived and need their user, by reason",
        None,
    )?;
    for (reason, n) in ATTENTION.iter().zip(agents.attention) {
        m.encode_family(&[("reason", reason.as_str())])?
            .encode_gauge(&n)?;
    }
    let mut m = gauge(
        encoder,
        "agents_attention_oldest_age",
        "How long the agent that has waited longest for its user, by reason, has waited (0: none waits)",
        Some(&Unit::Seconds),
    )?;
    for (reason, oldest) in ATTENTION.iter().zip(agents.oldest) {
        let age = oldest.map_or(0.0, |at| now.duration_since(at).as_secs_f64().max(0.0));
        m.encode_family(&[("reason", reason.as_str())])?
            .encode_gauge(&age)?;
    }

    Ok(())
}

impl Fleet {
    /// Runtimes by state, the ceiling, inboxes, and the live agents' processes.
    fn encode_runtimes(
        &self,
        encoder: &mut DescriptorEncoder,
        unarchived: u64,
    ) -> Result<(), std::fmt::Error> {
        let census = self.runtimes.census();
        let not_cold = census.queued + census.starting + census.live;
        let cold = usize::try_from(unarchived)
            .unwrap_or(usize::MAX)
            .saturating_sub(not_cold);
        let mut m = gauge(
            encoder,
            "runtimes",
            "Agents' runtimes by state: live (a process with an open session), starting, queued (waiting under max_live), cold (no process)",
            None,
        )?;
        for (state, n) in [
            ("live", census.live),
            ("starting", census.starting),
            ("queued", census.queued),
            ("cold", cold),
        ] {
            m.encode_family(&[("state", state)])?.encode_gauge(&n)?;
        }
        if let Some(max_live) = self.runtimes.runtime_settings().max_live {
            gauge(
                encoder,
                "runtimes_max_live",
                "The ceiling on agent processes ([runtimes] max_live); absent when there is none",
                None,
            )?
            .encode_gauge(&max_live)?;
        }
        gauge(
            encoder,
            "inbox_messages",
            "Messages queued in the agents' inboxes, not yet delivered",
            None,
        )?
        .encode_gauge(&census.inbox_messages)?;

        let (processes, rss) = drover_acp::process::fleet_memory(&census.pids);
        gauge(
            encoder,
            "agent_processes",
            "Processes in the live agents' process trees (each agent's group and descendants)",
            None,
        )?
        .encode_gauge(&processes)?;
        gauge(
            encoder,
            "agent_resident_memory",
            "Resident memory of the live agents' process trees (the sum of each process's RSS)",
            Some(&Unit::Bytes),
        )?
        .encode_gauge(&rss)?;

        Ok(())
    }

    /// Jobs, schedules, and the daemon's version.
    fn encode_work(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut m = gauge(encoder, "jobs", "Background jobs by status", None)?;
        for (status, n) in self.runtimes.jobs().count_by_status() {
            m.encode_family(&[("status", status.as_str())])?
                .encode_gauge(&n)?;
        }
        let mut m = gauge(encoder, "schedules", "Schedules by state", None)?;
        for (state, n) in self.schedules.count_by_state() {
            m.encode_family(&[("state", state.as_str())])?
                .encode_gauge(&n)?;
        }

        let mut m = encoder.encode_descriptor(
            "build",
            "The daemon's version (always 1)",
            None,
            MetricType::Info,
        )?;
        m.encode_info(&[("version", env!("CARGO_PKG_VERSION"))])?;
        Ok(())
    }
}

/// The daemon's own process, from `/proc/self` (the crate's process collector is not used:
/// these few reads are all it would do here).
#[derive(Debug)]
struct OwnProcess {
    started_at: Timestamp,
}

impl Collector for OwnProcess {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stat = own_stat();
        if let Some(stat) = &stat {
            let cpu = ConstCounter::new(stat.cpu_seconds);
            let m = encoder.encode_descriptor(
                "process_cpu",
                "User and system CPU time the daemon spent",
                Some(&Unit::Seconds),
                cpu.metric_type(),
            )?;
            cpu.encode(m)?;
            gauge(
                &mut encoder,
                "process_resident_memory",
                "The daemon's resident memory",
                Some(&Unit::Bytes),
            )?
            .encode_gauge(&stat.rss_bytes)?;
            gauge(
                &mut encoder,
                "process_virtual_memory",
                "The daemon's virtual memory",
                Some(&Unit::Bytes),
            )?
            .encode_gauge(&stat.vsize_bytes)?;
        }
        if let Some(fds) = open_fds() {
            gauge(
                &mut encoder,
                "process_open_fds",
                "File descriptors the daemon has open",
                None,
            )?
            .encode_gauge(&fds)?;
        }
        if let Some(max) = max_fds() {
            gauge(
                &mut encoder,
                "process_max_fds",
                "The daemon's limit on open file descriptors",
                None,
            )?
            .encode_gauge(&max)?;
        }
        let started = self.started_at.as_millisecond() as f64 / 1000.0;
        gauge(
            &mut encoder,
            "process_start_time",
            "When the daemon started, in seconds since the Unix epoch",
            Some(&Unit::Seconds),
        )?
        .encode_gauge(&started)?;
        Ok(())
    }
}

struct OwnStat {
    cpu_seconds: f64,
    rss_bytes: u64,
    vsize_bytes: u64,
}

/// `USER_HZ`, the unit of `/proc`'s CPU times: 100 in Linux's ABI on every architecture.
const USER_HZ: f64 = 100.0;

/// utime, stime and vsize of `/proc/self/stat`, and `VmRSS` of `/proc/self/status`.
fn own_stat() -> Option<OwnStat> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces and parentheses: fields start after the last `)`.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 of proc(5); field n is fields[n - 3].
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let rss_kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(OwnStat {
        cpu_seconds: (field(14)? + field(15)?) as f64 / USER_HZ,
        vsize_bytes: field(23)?,
        rss_bytes: rss_kb * 1024,
    })
}

fn open_fds() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count())
}

/// The soft limit of `Max open files` in `/proc/self/limits`.
fn max_fds() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}
