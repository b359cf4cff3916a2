//! Where a SOURCE lives: an http(s) URL, `hf://owner/repo[@revision]/path`, or a local path;
//! its siblings (the other parts of a split set, `config.json`), and opening one as a
//! [`ByteSource`] with a validator that a resumed fetch compares.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tarfa_gguf::{ByteSource, FileSource};

use crate::error::{FetchError, Result, SourceArgFault};
use crate::http::{HttpClient, RemoteFile};

/// The Hugging Face hub, unless `HF_ENDPOINT` says otherwise.
pub const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";

/// A file to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// An http(s) URL (an `hf://` source resolved to the hub's `resolve` URL).
    Http(String),
    /// A local file or directory.
    Local(PathBuf),
}

/// Percent-encode what may not stand in a URL path segment (a revision like `refs/pr/1`).
fn encode_segment(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Location {
    /// Parse SOURCE. `hf_endpoint` replaces `https://huggingface.co` for `hf://` sources.
    pub fn parse(arg: &str, hf_endpoint: &str) -> Result<Location> {
        let bad = |fault: SourceArgFault| FetchError::BadSource {
            source_arg: arg.to_string(),
            fault,
        };
        if let Some(rest) = arg.strip_prefix("hf://") {
            let mut it = rest.splitn(3, '/');
            let (owner, repo, path) = (it.next(), it.next(), it.next());
            let (Some(owner), Some(repo_rev), Some(path)) = (owner, repo, path) else {
                return Err(bad(SourceArgFault::NotHfPath));
            };
            let (repo, rev) = repo_rev.split_once('@').unwrap_or((repo_rev, "main"));
            let plain = |s: &str| {
                !s.is_empty() && s != "." && s != ".." && !s.contains(['?', '#', '%', '\\'])
            };
            if !plain(owner) || !plain(repo) || rev.is_empty() || !path.split('/').all(plain) {
                return Err(bad(SourceArgFault::NotHfPath));
            }
            let endpoint = hf_endpoint.trim_end_matches('/');
            if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
                return Err(bad(SourceArgFault::EndpointNotHttp));
            }
            return Ok(Location::Http(format!(
                "{endpoint}/{owner}/{repo}/resolve/{}/{path}",
                encode_segment(rev)
            )));
        }
        if arg.starts_with("http://") || arg.starts_with("https://") {
            // A URL needs a host: `https://` or `https:///x` would only fail later, at connect.
            let host = arg
                .split_once("://")
                .and_then(|(_, rest)| rest.split(['/', '?', '#']).next())
                .and_then(|authority| authority.rsplit('@').next())
                .unwrap_or("");
            if crate::http::origin(arg).is_none() || host.is_empty() {
                return Err(bad(SourceArgFault::NotAUrl));
            }
            return Ok(Location::Http(arg.to_string()));
        }
        if arg.contains("://") {
            return Err(bad(SourceArgFault::UnknownScheme));
        }
        Ok(Location::Local(PathBuf::from(arg)))
    }

    /// The last path component (without a query string).
    pub fn file_name(&self) -> String {
        match self {
            Location::Http(u) => {
                let path = u.split(['?', '#']).next().unwrap_or(u);
                path.rsplit('/').next().unwrap_or("").to_string()
            }
            Location::Local(p) => p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        }
    }

    /// The file `name` in the same directory (a URL's query string is dropped).
    pub fn sibling(&self, name: &str) -> Location {
        match self {
            Location::Http(u) => {
                let path = u.split(['?', '#']).next().unwrap_or(u);
                let dir = path.rfind('/').map_or(path, |i| &path[..=i]);
                Location::Http(format!("{dir}{name}"))
            }
            Location::Local(p) => Location::Local(p.with_file_name(name)),
        }
    }

    /// The path of a local file; `None` for a URL.
    pub fn local_path(&self) -> Option<&Path> {
        match self {
            Location::Http(_) => None,
            Location::Local(p) => Some(p),
        }
    }

    /// A name for messages.
    pub fn display(&self) -> String {
        match self {
            Location::Http(u) => u.clone(),
            Location::Local(p) => p.display().to_string(),
        }
    }

    /// Open for range reads. A URL is probed with a GET of its first `probe` bytes.
    pub fn open(&self, client: &Arc<HttpClient>, probe: u64) -> Result<Opened> {
        match self {
            Location::Http(u) => {
                let r = Arc::new(RemoteFile::open(client.clone(), u, probe)?);
                Ok(Opened {
                    validator: r.validator().describe(),
                    source: r.clone(),
                    remote: Some(r),
                })
            }
            Location::Local(p) => {
                let f = FileSource::open(p)?;
                let meta = std::fs::metadata(p).map_err(FetchError::io(p, "stat"))?;
                let mtime = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos());
                Ok(Opened {
                    validator: format!("local {} {mtime}", meta.len()),
                    source: Arc::new(f),
                    remote: None,
                })
            }
        }
    }

    /// Read a small whole file (config.json, an index); `None` when it does not exist.
    pub fn read_small(&self, client: &HttpClient, limit: u64) -> Result<Option<Vec<u8>>> {
        match self {
            Location::Http(u) => client.get_small(u, limit),
            Location::Local(p) => read_local_small(p, limit),
        }
    }
}

fn read_local_small(p: &Path, limit: u64) -> Result<Option<Vec<u8>>> {
    let Some(bytes) = tarfa_format::fsio::read_regular_if_exists(p, limit)? else {
        return Ok(None);
    };
    if bytes.starts_with(crate::LFS_PREFIX) {
        return Err(FetchError::NotAModel {
            url: p.display().to_string(),
            what: crate::error::NotModelKind::LfsPointer,
            hint: Some(crate::error::NotModelHint::LocalLfsPull),
        });
    }
    Ok(Some(bytes))
}

/// An opened source: the bytes, and what identifies this version of them.
#[derive(Clone)]
pub struct Opened {
    /// Range reads.
    pub source: Arc<dyn ByteSource>,
    /// ETag / Last-Modified of a URL, size and mtime of a local file.
    pub validator: String,
    /// The remote file, for URLs.
    pub remote: Option<Arc<RemoteFile>>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("source", &self.source.name())
            .field("validator", &self.validator)
            .finish()
    }
}

impl Opened {
    /// The header is read: later reads are data and go straight to the network.
    pub fn seal(&self) {
        if let Some(r) = &self.remote {
            r.seal_head();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hf_urls_resolve_to_the_hubs_resolve_url_with_the_revision_encoded() {
        let l = Location::parse(
            "hf://zai-org/GLM-4.5-Air@refs/pr/1/x-00001-of-00002.gguf",
            "http://127.0.0.1:9",
        );
        assert!(l.is_ok());
        let l = Location::parse("hf://o/r@v1.0/sub/m.gguf", "http://127.0.0.1:9/")
            .unwrap_or(Location::Local(PathBuf::new()));
        assert_eq!(
            l,
            Location::Http("http://127.0.0.1:9/o/r/resolve/v1.0/sub/m.gguf".into())
        );
        let l = Location::parse("hf://o/r/m.gguf", DEFAULT_HF_ENDPOINT)
            .unwrap_or(Location::Local(PathBuf::new()));
        assert_eq!(
            l,
            Location::Http("https://huggingface.co/o/r/resolve/main/m.gguf".into())
        );
        let fault = |arg: &str, endpoint: &str| match Location::parse(arg, endpoint) {
            Err(FetchError::BadSource { fault, .. }) => Some(fault),
            _ => None,
        };
        let hf = DEFAULT_HF_ENDPOINT;
        assert_eq!(fault("hf://o/r", hf), Some(SourceArgFault::NotHfPath));
        assert_eq!(
            fault("hf://o/../m.gguf", hf),
            Some(SourceArgFault::NotHfPath)
        );
        assert_eq!(fault("ftp://x/y", hf), Some(SourceArgFault::UnknownScheme));
        assert_eq!(fault("https://", hf), Some(SourceArgFault::NotAUrl));
        assert_eq!(
            fault("hf://o/r/m.gguf", "ftp://mirror"),
            Some(SourceArgFault::EndpointNotHttp)
        );
    }

    #[test]
    fn siblings_replace_the_last_segment_and_drop_the_query() {
        let l = Location::Http("http://h/a/m-00002-of-00003.gguf?sig=1".into());
        assert_eq!(l.file_name(), "m-00002-of-00003.gguf");
        assert_eq!(
            l.sibling("config.json"),
            Location::Http("http://h/a/config.json".into())
        );
    }
}
