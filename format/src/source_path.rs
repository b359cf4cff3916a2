//! The one rule for a source file's path, relative to the source checkpoint's directory: a
//! region's `src_file` (spec §5.1) and a manifest's `conversion.sources[].path` and
//! `files[].sources[].path` (§8.1) are the same kind of name, so they obey one rule, checked here
//! for the reader, the writer, the manifest and the converter alike.
//!
//! A reader on any platform must be able to join the path to a directory without leaving it or
//! naming something else, so `\` separates as `/` does (Windows), and `:` is refused in every
//! component (a drive letter `C:x`, an NTFS stream `a:b`).

/// What breaks the source-path rule (§5.1): one variant per clause.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SourcePathFault {
    /// The empty string (where a path is required).
    #[error("it is empty")]
    Empty,
    /// A NUL byte.
    #[error("it contains a NUL byte")]
    Nul,
    /// A leading `/` or `\`.
    #[error("it is absolute (starts with '/' or '\\')")]
    Absolute,
    /// An empty component (`a//b`, a trailing separator).
    #[error("it has an empty component")]
    EmptyComponent,
    /// A `.` or `..` component.
    #[error("it has a '.' or '..' component")]
    DotComponent,
    /// A component holding `:` (a drive letter or a stream name).
    #[error("a component contains ':'")]
    Colon,
}

/// Check `path` against the source-path rule: not empty, no NUL, not starting with `/` or `\`,
/// and, split at both `/` and `\`, no component empty, `.` or `..`, or containing `:`. So
/// `a/b.safetensors` and `a\b.safetensors` are valid; `./a`, `a//b`, `a\..\b` and `C:x` are not.
pub fn check_source_path(path: &str) -> Result<(), SourcePathFault> {
    if path.is_empty() {
        return Err(SourcePathFault::Empty);
    }
    if path.contains('\0') {
        return Err(SourcePathFault::Nul);
    }
    if path.starts_with(['/', '\\']) {
        return Err(SourcePathFault::Absolute);
    }
    for c in path.split(['/', '\\']) {
        if c.is_empty() {
            return Err(SourcePathFault::EmptyComponent);
        }
        if c == "." || c == ".." {
            return Err(SourcePathFault::DotComponent);
        }
        if c.contains(':') {
            return Err(SourcePathFault::Colon);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{check_source_path, SourcePathFault as F};

    #[test]
    fn each_clause_of_the_source_path_rule_has_its_fault() {
        for ok in [
            "a",
            "a/b.safetensors",
            "a\\b",
            "x.y/..z/z..",
            "...",
            ".hidden",
        ] {
            assert_eq!(check_source_path(ok), Ok(()), "{ok:?}");
        }
        let cases = [
            ("", F::Empty),
            ("a\0b", F::Nul),
            ("/a", F::Absolute),
            ("\\a", F::Absolute),
            ("a//b", F::EmptyComponent),
            ("a/", F::EmptyComponent),
            ("a\\", F::EmptyComponent),
            ("./a", F::DotComponent),
            ("a/..", F::DotComponent),
            ("a\\..\\b", F::DotComponent),
            ("C:x", F::Colon),
            ("a/b:c", F::Colon),
            ("a\\C:", F::Colon),
        ];
        for (path, want) in cases {
            assert_eq!(check_source_path(path), Err(want), "{path:?}");
        }
    }
}
