//! `WWW-Authenticate` challenges (RFC 7235): `Bearer realm="…",service="…",
//! scope="…"` from registries with a token service, `Basic realm="…"` from
//! ones behind basic auth.
//!
//! The header is untrusted: the parser takes any bytes, never panics, reads
//! at most [`MAX_HEADER`] bytes, and skips what it cannot make sense of.

/// Longest header parsed; the rest is ignored.
pub const MAX_HEADER: usize = 16 * 1024;

/// One challenge: the scheme (lowercase) and its parameters (names
/// lowercase, values unquoted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    pub scheme: String,
    pub params: Vec<(String, String)>,
}

impl Challenge {
    /// A parameter by (lowercase) name.
    #[must_use]
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t') {
            self.i += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn token(&mut self) -> Option<&str> {
        let start = self.i;
        while self.i < self.s.len() && is_tchar(self.s[self.i]) {
            self.i += 1;
        }
        (self.i > start)
            .then(|| std::str::from_utf8(&self.s[start..self.i]).ok())
            .flatten()
    }

    /// A token68 or token value, or a quoted string.
    fn value(&mut self) -> String {
        if self.peek() == Some(b'"') {
            self.i += 1;
            let mut out = Vec::new();
            while let Some(b) = self.peek() {
                self.i += 1;
                match b {
                    b'"' => break,
                    b'\\' => {
                        if let Some(n) = self.peek() {
                            out.push(n);
                            self.i += 1;
                        }
                    }
                    _ => out.push(b),
                }
            }
            String::from_utf8_lossy(&out).into_owned()
        } else {
            let start = self.i;
            while self.i < self.s.len() && (is_tchar(self.s[self.i]) || self.s[self.i] == b'/') {
                self.i += 1;
            }
            // token68 may end in '='.
            while self.peek() == Some(b'=') {
                self.i += 1;
            }
            String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
        }
    }

    /// Skips to just after the next comma (or the end).
    fn skip_past_comma(&mut self) {
        while let Some(b) = self.peek() {
            self.i += 1;
            if b == b',' {
                return;
            }
        }
    }
}

/// Parses every challenge in a `WWW-Authenticate` header value.
#[must_use]
pub fn parse(header: &[u8]) -> Vec<Challenge> {
    let s = &header[..header.len().min(MAX_HEADER)];
    let mut c = Cursor { s, i: 0 };
    let mut out: Vec<Challenge> = Vec::new();
    loop {
        c.skip_ws();
        while c.peek() == Some(b',') {
            c.i += 1;
            c.skip_ws();
        }
        if c.peek().is_none() {
            break;
        }
        // A parameter (`name=`) continues the current challenge; a bare
        // token starts a new one.
        let at = c.i;
        let Some(tok) = c.token().map(str::to_ascii_lowercase) else {
            c.skip_past_comma();
            continue;
        };
        let after_tok = c.i;
        c.skip_ws();
        let is_param = c.peek() == Some(b'=') && {
            // `name=` but not a token68 ending in '=' (followed by , or end).
            let mut j = c.i;
            while j < s.len() && s[j] == b'=' {
                j += 1;
            }
            let mut k = j;
            while k < s.len() && matches!(s[k], b' ' | b'\t') {
                k += 1;
            }
            j - c.i == 1 && !(k >= s.len() || s[k] == b',')
        };
        match (is_param, out.last_mut()) {
            (true, Some(ch)) => {
                c.i += 1;
                c.skip_ws();
                let v = c.value();
                ch.params.push((tok, v));
                c.skip_ws();
                if c.peek() != Some(b',') && c.peek().is_some() {
                    c.skip_past_comma();
                }
            }
            (true, None) => c.skip_past_comma(),
            (false, _) => {
                c.i = after_tok;
                let scheme = tok;
                let mut ch = Challenge {
                    scheme,
                    params: Vec::new(),
                };
                c.skip_ws();
                // The first parameter (or a token68) follows after spaces.
                if c.i > after_tok {
                    let save = c.i;
                    if let Some(name) = c.token().map(str::to_ascii_lowercase) {
                        c.skip_ws();
                        if c.peek() == Some(b'=')
                            && s.get(c.i + 1).is_some_and(|b| *b != b'=' && *b != b',')
                        {
                            c.i += 1;
                            c.skip_ws();
                            let v = c.value();
                            ch.params.push((name, v));
                        } else {
                            c.i = save;
                            let v = c.value();
                            ch.params.push((String::new(), v));
                        }
                    } else {
                        c.i = save;
                    }
                }
                out.push(ch);
                c.skip_ws();
                if c.peek() != Some(b',') && c.peek().is_some() && c.i == at {
                    c.skip_past_comma();
                }
            }
        }
        if c.i == at {
            // No progress: never loop forever on odd input.
            c.i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_challenges() {
        let v = parse(
            br#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/debian:pull""#,
        );
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].scheme, "bearer");
        assert_eq!(v[0].param("realm"), Some("https://auth.docker.io/token"));
        assert_eq!(v[0].param("service"), Some("registry.docker.io"));
        assert_eq!(v[0].param("scope"), Some("repository:library/debian:pull"));
        let v = parse(br#"Basic realm="Registry Realm""#);
        assert_eq!(v[0].scheme, "basic");
        assert_eq!(v[0].param("realm"), Some("Registry Realm"));
        let v = parse(br#"Basic realm="a, b", Bearer realm=x , error="insufficient_scope""#);
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[0].param("realm"), Some("a, b"));
        assert_eq!(v[1].scheme, "bearer");
        assert_eq!(v[1].param("realm"), Some("x"));
        assert_eq!(v[1].param("error"), Some("insufficient_scope"));
        let v = parse(br#"Bearer realm="q\"uote""#);
        assert_eq!(v[0].param("realm"), Some("q\"uote"));
        let v = parse(b"Negotiate abc123==, Basic");
        assert_eq!(v.len(), 2, "{v:?}");
        assert_eq!(v[0].param(""), Some("abc123=="));
        assert_eq!(v[1].scheme, "basic");
        assert!(parse(b"").is_empty());
        assert!(parse(b" , ,").is_empty());
    }
}
