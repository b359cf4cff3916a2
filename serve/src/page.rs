//! The chat page at `GET /` (`serve/static/index.html`, built into the binary): one static file,
//! its script and style inline, that streams from `/v1/chat/completions` as any client does.
//!
//! It is served without the API key, as llama-server serves its web UI: it holds no data, and
//! every route it calls needs the key (the page asks for it and keeps it in the browser). Its
//! `content-security-policy` lets run only the page's own script and style, named by their
//! SHA-256 (not `'unsafe-inline'`: text injected into the page could not run), lets it fetch from
//! this server only, and loads nothing else — no image, font, frame or form target.

use std::sync::LazyLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sha2::Digest;

/// The page.
pub const PAGE: &str = include_str!("../static/index.html");

/// The page's content-security-policy, computed once from its inline script and style.
static POLICY: LazyLock<String> = LazyLock::new(|| policy(PAGE));

/// The text between `<tag>` and `</tag>`: the page's inline script or style.
fn inline<'a>(page: &'a str, tag: &str) -> Option<&'a str> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let start = page.find(&open)? + open.len();
    let len = page[start..].find(&close)?;
    Some(&page[start..start + len])
}

/// A policy's source for an inline block: `'sha256-…'` of its exact text (what the browser
/// hashes), or `'none'` without one.
fn hash_source(block: Option<&str>) -> String {
    match block {
        Some(text) => format!(
            "'sha256-{}'",
            base64::engine::general_purpose::STANDARD.encode(sha2::Sha256::digest(text.as_bytes()))
        ),
        None => "'none'".to_string(),
    }
}

/// The policy for `page`: nothing by default; its own script and style; requests to this origin.
fn policy(page: &str) -> String {
    format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; base-uri 'none'; \
         form-action 'none'; frame-ancestors 'none'",
        hash_source(inline(page, "script")),
        hash_source(inline(page, "style")),
    )
}

/// `GET /`: the page, as HTML the browser must not sniff as anything else; revalidated on each
/// load, since a new binary brings a new page.
pub(crate) async fn index() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, POLICY.as_str()),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_names_the_pages_one_script_and_one_style_by_hash() {
        assert_eq!(PAGE.matches("<script").count(), 1, "one inline script");
        assert_eq!(PAGE.matches("<style").count(), 1, "one inline style");
        let p = policy(PAGE);
        for block in ["script", "style"] {
            let text = inline(PAGE, block).expect(block);
            assert!(text.len() > 100, "{block}: {text:?}");
            let source = format!("{block}-src {};", hash_source(Some(text)));
            assert!(p.contains(&source), "{source} not in {p}");
        }
        assert!(p.starts_with("default-src 'none';"), "{p}");
        assert!(!p.contains("unsafe"), "{p}");
        // SHA-256 of nothing, as CSP writes it.
        assert_eq!(
            hash_source(Some("")),
            "'sha256-47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU='"
        );
        assert_eq!(hash_source(inline("<p>", "script")), "'none'");
    }

    /// What the policy would block anyway, held out of the page so it fails here rather than in
    /// a browser's console: attributes that run or style (inline handlers, `style=`), anything
    /// loaded from elsewhere, and HTML made from strings (the model's text is untrusted).
    #[test]
    fn the_page_loads_nothing_from_elsewhere_and_never_parses_text_as_html() {
        let lower = PAGE.to_ascii_lowercase();
        for banned in [
            "http://",
            "https://",
            "//cdn",
            "@import",
            "url(",
            " style=",
            " onclick",
            " onload",
            " onerror",
            "innerhtml",
            "outerhtml",
            "insertadjacenthtml",
            "document.write",
            "eval(",
            "new function",
        ] {
            assert!(!lower.contains(banned), "the page holds {banned:?}");
        }
    }
}
