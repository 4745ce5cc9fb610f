//! Prometheus metrics at `/metrics`: requests by route and status, refusals by code, the
//! counters an operator watches (tasks, checkpoints, live SSE subscribers, decision long-polls
//! waiting), and how long an approval takes to reach each stage of its round trip (issue 31 §4).
//!
//! The gauges of what is held open (event streams, decision long-polls, connections) are also
//! how a test knows a client is listening before it makes the change the client waits for —
//! a fact read from the server, not a sleep that hopes it is so.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabels {
    stage: &'static str,
}

/// The stages of an approval's round trip, each timed from the decision's opening: a push
/// accepted by a device's push service, the device fetched it, showed it, a person opened it,
/// answered it there, and the runtime took the answer. A fixed set: the label stays bounded.
pub const STAGES: &[&str] = &["pushed", "fetched", "shown", "opened", "answered", "taken"];

/// The control plane's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RequestLabels, Histogram>,
    refusals: Family<CodeLabels, Counter>,
    stages: Family<StageLabels, Histogram>,
    /// Tasks created.
    pub tasks_created: Counter,
    /// Checkpoints appended.
    pub checkpoints: Counter,
    /// Control commands a worker's stream showed as handed over in memory, without a read.
    pub controls_handed_over: Counter,
    /// Connections served on the people's lane (`waymark-server::lanes`): event streams.
    pub people_lane_connections: Counter,
    sse: Gauge,
    decision_waits: Gauge,
    connections: Gauge,
    connections_refused: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("waymark");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RequestLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0])
        });
        let refusals = Family::<CodeLabels, Counter>::default();
        let stages = Family::<StageLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 7200.0,
            ])
        });
        let tasks_created = Counter::default();
        let checkpoints = Counter::default();
        let controls_handed_over = Counter::default();
        let people_lane_connections = Counter::default();
        let sse = Gauge::default();
        let decision_waits = Gauge::default();
        let connections = Gauge::default();
        let connections_refused = Counter::default();
        registry.register("http_requests", "HTTP requests answered", requests.clone());
        registry.register(
            "http_request_seconds",
            "HTTP request latency",
            latency.clone(),
        );
        registry.register(
            "refusals",
            "Writes refused by the rules, by code",
            refusals.clone(),
        );
        registry.register(
            "approval_stage_seconds",
            "From a decision's opening to each stage of its round trip, each first time: pushed, fetched, shown, opened, answered (on a device), taken (by the runtime)",
            stages.clone(),
        );
        registry.register("tasks_created", "Tasks created", tasks_created.clone());
        registry.register(
            "checkpoints_appended",
            "Checkpoints appended",
            checkpoints.clone(),
        );
        registry.register(
            "controls_handed_over",
            "Control commands a worker's stream showed from the replica that applied them, without a database read",
            controls_handed_over.clone(),
        );
        registry.register(
            "people_lane_connections",
            "Connections served on the people's lane: event streams, on a runtime of their own at a lower OS priority, apart from the control path",
            people_lane_connections.clone(),
        );
        registry.register("sse_subscribers", "Open event streams", sse.clone());
        registry.register(
            "decision_waits",
            "Decision long-polls (`GET /v1/tasks/{task}/decisions/{decision}?wait=`) held open, waiting for an answer",
            decision_waits.clone(),
        );
        registry.register(
            "connections_open",
            "Open client connections (counted against `serve --max-connections`)",
            connections.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections refused at the connection cap",
            connections_refused.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
            refusals,
            stages,
            tasks_created,
            checkpoints,
            controls_handed_over,
            people_lane_connections,
            sse,
            decision_waits,
            connections,
            connections_refused,
        }
    }
}

/// Decrements its gauge when what it counts (a stream, a waiting request) ends.
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    fn count(gauge: &Gauge) -> Self {
        gauge.inc();
        GaugeGuard(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Metrics {
    pub fn refusal_code(&self, code: &str) {
        self.refusals
            .get_or_create(&CodeLabels { code: code.into() })
            .inc();
    }

    /// A decision reached `stage` (one of [`STAGES`]) `seconds` after it opened.
    pub fn approval_stage(&self, stage: &'static str, seconds: f64) {
        debug_assert!(STAGES.contains(&stage));
        self.stages
            .get_or_create(&StageLabels { stage })
            .observe(seconds.max(0.0));
    }

    pub fn connection_opened(&self) {
        self.connections.inc();
    }

    pub fn connection_closed(&self) {
        self.connections.dec();
    }

    pub fn connection_refused(&self) {
        self.connections_refused.inc();
    }

    pub fn sse_subscriber(&self) -> GaugeGuard {
        GaugeGuard::count(&self.sse)
    }

    /// A decision long-poll starts waiting: counted until it answers.
    pub fn decision_wait(&self) -> GaugeGuard {
        GaugeGuard::count(&self.decision_waits)
    }

    /// Counts an answered request by method label, route pattern and status, with its time.
    pub fn request(&self, method: &str, route: String, status: u16, seconds: f64) {
        let labels = RequestLabels {
            method: method.to_owned(),
            route,
            status,
        };
        self.requests.get_or_create(&labels).inc();
        self.latency.get_or_create(&labels).observe(seconds);
    }

    /// Every metric in the OpenMetrics text format; `None` when it cannot be written.
    pub fn encode(&self) -> Option<String> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).ok()?;
        Some(out)
    }
}
