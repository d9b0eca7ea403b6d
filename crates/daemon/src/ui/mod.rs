//! The web UI's static files, embedded in the binary and served at `/` and `/ui/…` on the
//! daemon's own port. They hold no data (everything with data goes over `/ws` after `hello`
//! with the token), so they are served without a token; the headers keep the page from
//! loading anything but itself.

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// One embedded file.
struct Asset {
    name: &'static str,
    mime: &'static str,
    body: &'static [u8],
}

/// One embedded file of `assets/`, by name, with its type.
macro_rules! asset {
    ($name:literal, $mime:expr) => {
        Asset {
            name: $name,
            mime: $mime,
            body: include_bytes!(concat!("assets/", $name)),
        }
    };
}

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// Every file of the page: plain ES modules and CSS, no build step, so what is here is what
/// the browser runs.
const ASSETS: &[Asset] = &[
    asset!("index.html", HTML),
    asset!("style.css", CSS),
    asset!("app.js", JS),
    asset!("conn.js", JS),
    asset!("markdown.js", JS),
    asset!("timeline.js", JS),
    asset!("sidebar.js", JS),
    asset!("startcard.js", JS),
    asset!("protocol.gen.js", JS),
    asset!("dom.js", JS),
    asset!("terminal.js", JS),
    // xterm.js, vendored by scripts/vendor-xterm (versions in xterm.LICENSE).
    asset!("xterm.mjs", JS),
    asset!("xterm-addon-fit.mjs", JS),
    asset!("xterm.css", CSS),
    asset!("favicon.svg", SVG),
];

/// No inline script, nothing from elsewhere; the socket goes to this origin only. Inline
/// styles are allowed: xterm.js sizes and colours the terminal's cells with `<style>`
/// elements and `style` attributes it writes itself; a style runs no code, and the page never
/// parses markup from data (see `dom.js`), so nothing else can write one.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// An entity tag per file, from its bytes: the browser revalidates (`no-cache`) and gets a
/// 304 until the daemon's binary, and so the file, changes.
static TAGS: LazyLock<Vec<String>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|a| format!("\"{:016x}\"", fnv1a(a.body)))
        .collect()
});

/// FNV-1a, 64 bits: stable across builds and runs (unlike std's `DefaultHasher`), and enough
/// to tell two versions of a file apart.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// `GET /`: the page.
pub(crate) async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

/// `GET /ui/{file}`: a script, the stylesheet or the icon.
pub(crate) async fn asset(Path(file): Path<String>, headers: HeaderMap) -> Response {
    serve(&file, &headers)
}

fn serve(name: &str, headers: &HeaderMap) -> Response {
    let Some(i) = ASSETS.iter().position(|a| a.name == name) else {
        let message = format!("no web UI file `{name}`");
        return (
            StatusCode::NOT_FOUND,
            axum::Json(serde_json::json!({"error": {"code": "not_found", "message": message}})),
        )
            .into_response();
    };
    let asset = &ASSETS[i];
    let tag = &TAGS[i];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag));
    let mut response = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(header::CONTENT_TYPE, HeaderValue::from_static(asset.mime))],
            asset.body,
        )
            .into_response()
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(tag) = HeaderValue::from_str(tag) {
        h.insert(header::ETAG, tag);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extension(name: &str) -> Option<&str> {
        std::path::Path::new(name)
            .extension()
            .and_then(|e| e.to_str())
    }

    #[test]
    fn every_module_the_page_imports_is_served() {
        // A module imported but not in ASSETS would 404 in the browser and leave a blank page.
        for asset in ASSETS
            .iter()
            .filter(|a| a.mime.starts_with("text/javascript") && extension(a.name) != Some("mjs"))
        {
            let text = std::str::from_utf8(asset.body).expect("utf-8");
            // Modules loaded later (`import(XTERM)`) are named in a constant: `'./x.mjs'`.
            for named in text.split("'./").skip(1) {
                let file = named.split('\'').next().unwrap_or_default();
                if matches!(extension(file), Some("js" | "mjs")) {
                    assert!(
                        ASSETS.iter().any(|a| a.name == file),
                        "{} loads {file}, which is not served",
                        asset.name
                    );
                }
            }
            for line in text.lines().filter(|l| l.starts_with("import ")) {
                let Some(from) = line.split("from './").nth(1) else {
                    continue;
                };
                let file = from.split('\'').next().unwrap_or_default();
                assert!(
                    ASSETS.iter().any(|a| a.name == file),
                    "{} imports {file}, which is not served",
                    asset.name
                );
            }
        }
    }

    #[test]
    fn tags_differ_when_bytes_do() {
        assert_ne!(fnv1a(b"a"), fnv1a(b"b"));
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    }
}
