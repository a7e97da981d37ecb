//! Logs and traces: one `tracing` subscriber with a human or JSON log layer
//! on stderr and, when an OTLP endpoint is configured, an OpenTelemetry layer
//! that exports spans over OTLP/HTTP (protobuf bodies).
//!
//! Configuration is the OpenTelemetry SDK's own environment, so a collector
//! set up for other services works unchanged:
//!
//! | variable | effect |
//! |---|---|
//! | `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | enables export (`/v1/traces` is appended to the first) |
//! | `OTEL_EXPORTER_OTLP_HEADERS` / `..._TRACES_HEADERS` | extra headers, e.g. an API key; never logged |
//! | `OTEL_EXPORTER_OTLP_PROTOCOL` | must be `http/protobuf` if set: gRPC is not built, to keep builds light |
//! | `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` | resource; the service name defaults to `leasehold` |
//! | `OTEL_SDK_DISABLED=true` | no export even with an endpoint |
//! | `LEASEHOLD_OTEL_FILTER` | which spans are exported; default `leasehold=debug`, which includes the span around every bucket request |
//!
//! The log filter (`LEASEHOLD_LOG`) and the export filter are separate on
//! purpose: an operator who wants every bucket request in their tracing
//! backend should not have to see each one on stderr too.

use crate::error::Error;
// Export errors can quote the endpoint URL, which may carry userinfo; header
// values never reach our messages. Redacted like a store's URL.
use crate::store::objstore::redact;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// How logs are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum LogFormat {
    /// Human-readable lines (colour when stderr is a terminal).
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// Keeps the exporter alive; [`Telemetry::shutdown`] flushes what is queued.
///
/// Dropping it without `shutdown` loses at most the spans of the last batch
/// interval. `shutdown` blocks (the batch processor exports from its own
/// thread with a blocking HTTP client), so call it outside the async runtime,
/// after the command has finished.
#[must_use = "call shutdown() at exit to flush exported spans"]
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are being exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Flushes queued spans and stops the exporter.
    pub fn shutdown(self) {
        if let Some(p) = self.provider {
            // A collector that is down must not keep the CLI from exiting:
            // the SDK bounds the flush by its export timeout.
            if let Err(e) = p.shutdown() {
                eprintln!("warning: OTLP export: {}", redact(&e.to_string()));
            }
        }
    }
}

/// The log writer: every event line goes to stderr through [`redact`], so
/// a dependency's trace logs (request URLs with a signed query string, an
/// endpoint with userinfo) never print a secret, whatever `LEASEHOLD_LOG`
/// lets through. The fmt layer makes one writer per event and writes the
/// whole line into it; the line is redacted and written when it is dropped.
struct Redacting;

struct RedactedLine(Vec<u8>);

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Redacting {
    type Writer = RedactedLine;
    fn make_writer(&'a self) -> RedactedLine {
        RedactedLine(Vec::new())
    }
}

impl std::io::Write for RedactedLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for RedactedLine {
    fn drop(&mut self) {
        use std::io::Write;
        let line = redact(&String::from_utf8_lossy(&self.0));
        // A closed stderr loses the line, never the process.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// Installs the global subscriber: the log layer filtered by `LEASEHOLD_LOG`
/// (else `default_filter`), and the OTLP layer when configured.
///
/// Errors are configuration errors (an unsupported protocol, a malformed
/// endpoint) and are typed [`crate::ErrorKind::Invalid`].
pub fn init(default_filter: &str, format: LogFormat) -> Result<Telemetry, Error> {
    // A filter that does not parse is refused, not silently replaced by the
    // default: an operator who asked for debug logs and got none would be
    // misled about what the node is doing.
    let filter = match std::env::var("LEASEHOLD_LOG") {
        Ok(v) if !v.trim().is_empty() => {
            tracing_subscriber::EnvFilter::try_new(&v).map_err(|e| {
                Error::invalid(
                    "LEASEHOLD_LOG",
                    format!("{v:?} is not a log filter ({e}); e.g. info, leasehold=debug,warn"),
                )
            })?
        }
        _ => tracing_subscriber::EnvFilter::new(default_filter),
    };
    let log = match format {
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(Redacting)
            .with_filter(filter)
            .boxed(),
        LogFormat::Human => tracing_subscriber::fmt::layer()
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(Redacting)
            .with_filter(filter)
            .boxed(),
    };
    let (otel, provider) = match otlp_provider()? {
        Some(provider) => {
            use opentelemetry::trace::TracerProvider as _;
            let export_filter =
                tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_OTEL_FILTER")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("leasehold=debug"));
            let layer = tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("leasehold"))
                .with_filter(export_filter);
            (Some(layer), Some(provider))
        }
        None => (None, None),
    };
    // A second init in one process (tests) keeps the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(log)
        .with(otel)
        .try_init();
    Ok(Telemetry { provider })
}

/// The tracer provider when the environment asks for export, else `None`.
fn otlp_provider() -> Result<Option<opentelemetry_sdk::trace::SdkTracerProvider>, Error> {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let endpoint =
        var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"));
    let Some(endpoint) = endpoint else {
        return Ok(None);
    };
    for k in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(p) = var(k) {
            if p != "http/protobuf" {
                return Err(Error::invalid(
                    k,
                    format!(
                        "{p:?} is not supported: leasehold exports OTLP over HTTP with protobuf bodies (set \"http/protobuf\" or unset it)"
                    ),
                ));
            }
            break;
        }
    }
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(Error::invalid(
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            format!(
                "{:?}: expected an http:// or https:// URL",
                redact(&endpoint)
            ),
        ));
    }
    use opentelemetry_otlp::{Protocol, WithExportConfig};
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .build()
        .map_err(|e| Error::invalid("OTLP exporter", redact(&e.to_string())))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if var("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("leasehold");
    }
    resource = resource.with_attribute(opentelemetry::KeyValue::new(
        "service.version",
        env!("CARGO_PKG_VERSION"),
    ));
    Ok(Some(
        opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build(),
    ))
}
