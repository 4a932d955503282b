//! The addon's logs: off unless `FERRY_LOG` names a filter (`tracing`'s `EnvFilter`
//! syntax: `debug`, `ferry_core=trace,info`), written to stderr as text (in colour only on
//! a terminal) or, with `FERRY_LOG_FORMAT=json`, as one JSON object per line for a log
//! collector.

use std::sync::Once;

static LOGGING: Once = Once::new();

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, the event's fields
    /// (`message` among them), and the spans it happened in.
    Json,
}

/// The format `FERRY_LOG_FORMAT` asks for: `text` (or unset) or `json`; any other value is
/// named in the error, and text is used.
fn log_format(value: Option<&str>) -> Result<LogFormat, String> {
    match value.map(str::trim) {
        None | Some("") => Ok(LogFormat::Text),
        Some(v) if v.eq_ignore_ascii_case("text") => Ok(LogFormat::Text),
        Some(v) if v.eq_ignore_ascii_case("json") => Ok(LogFormat::Json),
        Some(v) => Err(format!(
            "FERRY_LOG_FORMAT={v:?} is neither \"text\" nor \"json\"; logging as text"
        )),
    }
}

/// Starts logging once per process, as the environment asks; nothing when `FERRY_LOG` is
/// unset or another subscriber is installed already.
pub(crate) fn init() {
    LOGGING.call_once(|| {
        let Ok(filter) = std::env::var("FERRY_LOG") else {
            return;
        };
        let filter = tracing_subscriber::EnvFilter::new(filter);
        let format = log_format(std::env::var("FERRY_LOG_FORMAT").ok().as_deref());
        let installed = match format {
            Ok(LogFormat::Json) => tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(true)
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .try_init(),
            Ok(LogFormat::Text) | Err(_) => {
                // Colour only on a terminal: escape codes in a pipe or a log file are noise.
                let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
                tracing_subscriber::fmt()
                    .with_env_filter(filter)
                    .with_ansi(ansi)
                    .with_writer(std::io::stderr)
                    .try_init()
            }
        };
        if let (Ok(()), Err(why)) = (installed, format) {
            tracing::warn!("{why}");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_is_text_unless_json_is_asked_for() {
        assert_eq!(log_format(None), Ok(LogFormat::Text));
        assert_eq!(log_format(Some("")), Ok(LogFormat::Text));
        assert_eq!(log_format(Some("text")), Ok(LogFormat::Text));
        assert_eq!(log_format(Some("JSON")), Ok(LogFormat::Json));
        assert_eq!(log_format(Some(" json ")), Ok(LogFormat::Json));
        let err = log_format(Some("yaml")).unwrap_err();
        assert!(err.contains("\"yaml\""), "{err}");
    }
}
