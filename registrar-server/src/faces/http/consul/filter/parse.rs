//! The reading of a filter: a lexer, then a recursive-descent parser
//! (`or` binds loosest, then `and`, then `not`), each selector checked
//! against the route's as it is read.

use waypost::backend::quote;

use super::{Expr, Kind, Op, Selectors, MAX_FILTER_BYTES};

/// The deepest nesting of parentheses and `not` taken.
const MAX_DEPTH: usize = 32;

/// Why a filter was refused; each names the part at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FilterError {
    /// Not an expression of the language.
    #[error("at character {at}: {reason}")]
    Syntax {
        /// Where (in characters, from 0).
        at: usize,
        /// What was expected or found.
        reason: String,
    },
    /// A part of Consul's language the registrar does not take.
    #[error("{what} is not supported: the registrar takes ==, !=, contains, not contains, in, not in, is empty, is not empty, not, and, or and parentheses")]
    Unsupported {
        /// The part, quoted.
        what: String,
    },
    /// A selector the route does not have.
    #[error("unknown selector {selector}: this route takes {known}")]
    UnknownSelector {
        /// The selector, quoted.
        selector: String,
        /// The route's selectors.
        known: String,
    },
    /// An operator that does not apply to what the selector reaches.
    #[error("{selector} is {kind}: {op} does not apply to it")]
    Operator {
        /// The selector, quoted.
        selector: String,
        /// What it reaches.
        kind: &'static str,
        /// The operator.
        op: &'static str,
    },
    /// Longer than [`MAX_FILTER_BYTES`].
    #[error("{len} bytes: longer than {MAX_FILTER_BYTES}")]
    TooLong {
        /// Its length.
        len: usize,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Open,
    Close,
    OpenBracket,
    CloseBracket,
    Eq,
    Ne,
    /// A quoted string (escapes read).
    Quoted(String),
    /// A bare word: a selector, a keyword, a bare value.
    Word(String),
}

fn syntax(at: usize, reason: impl Into<String>) -> FilterError {
    FilterError::Syntax {
        at,
        reason: reason.into(),
    }
}

/// The tokens of `text`, each with its position.
fn lex(text: &str) -> Result<Vec<(usize, Tok)>, FilterError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let at = i;
        match c {
            c if c.is_whitespace() => i += 1,
            '(' | ')' | '[' | ']' => {
                out.push((
                    at,
                    match c {
                        '(' => Tok::Open,
                        ')' => Tok::Close,
                        '[' => Tok::OpenBracket,
                        _ => Tok::CloseBracket,
                    },
                ));
                i += 1;
            }
            '=' | '!' if chars.get(i + 1) == Some(&'=') => {
                out.push((at, if c == '=' { Tok::Eq } else { Tok::Ne }));
                i += 2;
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err(syntax(at, "a double-quoted string is not closed")),
                        Some('"') => break,
                        Some('\\') => {
                            let e = chars
                                .get(i + 1)
                                .ok_or_else(|| syntax(i, "a string ends in a lone backslash"))?;
                            s.push(match e {
                                'n' => '\n',
                                't' => '\t',
                                'r' => '\r',
                                other => *other,
                            });
                            i += 2;
                        }
                        Some(ch) => {
                            s.push(*ch);
                            i += 1;
                        }
                    }
                }
                i += 1;
                out.push((at, Tok::Quoted(s)));
            }
            '`' => {
                let end = chars[i + 1..]
                    .iter()
                    .position(|c| *c == '`')
                    .ok_or_else(|| syntax(at, "a backtick-quoted string is not closed"))?;
                out.push((at, Tok::Quoted(chars[i + 1..i + 1 + end].iter().collect())));
                i += end + 2;
            }
            c if is_word(c) => {
                let len = chars[i..].iter().take_while(|c| is_word(**c)).count();
                out.push((at, Tok::Word(chars[i..i + len].iter().collect())));
                i += len;
            }
            other => {
                let op: String = chars[i..]
                    .iter()
                    .take_while(|c| !c.is_whitespace() && !is_word(**c) && **c != '"')
                    .collect();
                let what = if op.is_empty() { other.to_string() } else { op };
                return Err(FilterError::Unsupported {
                    what: format!("the operator {}", quote(&what)),
                });
            }
        }
    }
    Ok(out)
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/' | '+')
}

const KEYWORDS: [&str; 7] = ["and", "or", "not", "in", "contains", "is", "empty"];

/// Parse `text` for a route that takes `selectors`.
pub(super) fn parse(text: &str, selectors: Selectors) -> Result<Expr, FilterError> {
    if text.len() > MAX_FILTER_BYTES {
        return Err(FilterError::TooLong { len: text.len() });
    }
    let mut p = Parser {
        toks: lex(text)?,
        pos: 0,
        end: text.chars().count(),
        selectors,
        depth: 0,
    };
    let expr = p.or()?;
    match p.toks.get(p.pos) {
        None => Ok(expr),
        Some((at, t)) => Err(syntax(
            *at,
            format!("expected and, or or the end, found {}", shown(t)),
        )),
    }
}

fn shown(t: &Tok) -> String {
    match t {
        Tok::Open => "(".into(),
        Tok::Close => ")".into(),
        Tok::OpenBracket => "[".into(),
        Tok::CloseBracket => "]".into(),
        Tok::Eq => "==".into(),
        Tok::Ne => "!=".into(),
        Tok::Quoted(s) | Tok::Word(s) => quote(s),
    }
}

struct Parser {
    toks: Vec<(usize, Tok)>,
    pos: usize,
    /// The length of the text, in characters (where "the end" is).
    end: usize,
    selectors: Selectors,
    depth: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|(_, t)| t)
    }

    fn peek_word(&self, offset: usize) -> Option<&str> {
        match self.toks.get(self.pos + offset) {
            Some((_, Tok::Word(w))) => Some(w),
            _ => None,
        }
    }

    fn at(&self) -> usize {
        self.toks.get(self.pos).map_or(self.end, |(at, _)| *at)
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.toks.get(self.pos).map(|(_, t)| t.clone());
        self.pos += 1;
        t
    }

    /// Consume keyword `kw`, or fail saying what was `expected`.
    fn keyword(&mut self, kw: &str, expected: &str) -> Result<(), FilterError> {
        if self.peek_word(0) == Some(kw) {
            self.pos += 1;
            return Ok(());
        }
        Err(self.expected(expected))
    }

    fn expected(&self, what: &str) -> FilterError {
        let found = self.peek().map_or("the end".to_string(), shown);
        syntax(self.at(), format!("expected {what}, found {found}"))
    }

    fn or(&mut self) -> Result<Expr, FilterError> {
        let mut left = self.and()?;
        while self.peek_word(0) == Some("or") {
            self.pos += 1;
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, FilterError> {
        let mut left = self.unary()?;
        while self.peek_word(0) == Some("and") {
            self.pos += 1;
            left = Expr::And(Box::new(left), Box::new(self.unary()?));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, FilterError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(syntax(self.at(), format!("nested deeper than {MAX_DEPTH}")));
        }
        let expr = if self.peek_word(0) == Some("not") {
            self.pos += 1;
            Expr::Not(Box::new(self.unary()?))
        } else if self.peek() == Some(&Tok::Open) {
            self.pos += 1;
            let e = self.or()?;
            if self.peek() != Some(&Tok::Close) {
                return Err(self.expected(")"));
            }
            self.pos += 1;
            e
        } else {
            self.matching()?
        };
        self.depth -= 1;
        Ok(expr)
    }

    /// A match: `S == v`, `S != v`, `S [not] contains v`, `v [not] in S`,
    /// `S is [not] empty`.
    fn matching(&mut self) -> Result<Expr, FilterError> {
        let value_first = match self.peek() {
            Some(Tok::Quoted(_)) => true,
            Some(Tok::Word(_)) => {
                self.peek_word(1) == Some("in")
                    || (self.peek_word(1) == Some("not") && self.peek_word(2) == Some("in"))
            }
            _ => return Err(self.expected("a selector or a value")),
        };
        if value_first {
            let value = self.value()?;
            let op = if self.peek_word(0) == Some("not") {
                self.pos += 1;
                Op::NotContains
            } else {
                Op::Contains
            };
            self.keyword("in", "in or not in")?;
            let (path, kind, name) = self.selector()?;
            return check(path, kind, &name, op, Some(value));
        }
        let (path, kind, name) = self.selector()?;
        let at = self.at();
        let (op, takes_value) = match self.next() {
            Some(Tok::Eq) => (Op::Eq, true),
            Some(Tok::Ne) => (Op::Ne, true),
            Some(Tok::Word(w)) if w == "contains" => (Op::Contains, true),
            Some(Tok::Word(w)) if w == "is" => {
                let not = self.peek_word(0) == Some("not");
                if not {
                    self.pos += 1;
                }
                self.keyword("empty", "empty")?;
                (if not { Op::IsNotEmpty } else { Op::IsEmpty }, false)
            }
            Some(Tok::Word(w)) if w == "not" => match self.next() {
                Some(Tok::Word(w)) if w == "contains" => (Op::NotContains, true),
                Some(Tok::Word(w)) if w == "matches" => return Err(unsupported("not matches")),
                _ => {
                    self.pos -= 1;
                    return Err(self.expected("contains after not"));
                }
            },
            Some(Tok::Word(w)) if w == "matches" => return Err(unsupported("matches")),
            other => {
                let found = other.as_ref().map_or("the end".to_string(), shown);
                return Err(syntax(
                    at,
                    format!(
                        "expected ==, !=, contains, not contains or is [not] empty after {}, found {found}",
                        quote(&name)
                    ),
                ));
            }
        };
        let value = if takes_value {
            Some(self.value()?)
        } else {
            None
        };
        check(path, kind, &name, op, value)
    }

    /// A value: quoted, or a bare word that is not a keyword.
    fn value(&mut self) -> Result<String, FilterError> {
        match self.peek() {
            Some(Tok::Quoted(s)) => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            Some(Tok::Word(w)) if !KEYWORDS.contains(&w.as_str()) => {
                let w = w.clone();
                self.pos += 1;
                Ok(w)
            }
            _ => Err(self.expected("a value")),
        }
    }

    /// A selector (`A.B`, `A.B["key"]`), checked against the route's:
    /// its path, what it reaches, and how it was written.
    fn selector(&mut self) -> Result<(Vec<String>, Kind, String), FilterError> {
        let at = self.at();
        let Some(Tok::Word(first)) = self.next() else {
            self.pos -= 1;
            return Err(self.expected("a selector"));
        };
        let mut name = first.clone();
        let mut path: Vec<String> = first.split('.').map(str::to_string).collect();
        while self.peek() == Some(&Tok::OpenBracket) {
            self.pos += 1;
            let Some(Tok::Quoted(key)) = self.next() else {
                self.pos -= 1;
                return Err(self.expected("a quoted map key after ["));
            };
            if self.next() != Some(Tok::CloseBracket) {
                self.pos -= 1;
                return Err(self.expected("]"));
            }
            name.push_str(&format!("[{key:?}]"));
            path.push(key);
        }
        if path.iter().any(String::is_empty) || KEYWORDS.contains(&first.as_str()) {
            return Err(syntax(at, format!("{} is not a selector", quote(&name))));
        }
        let kind = resolve(&path, self.selectors).ok_or_else(|| FilterError::UnknownSelector {
            selector: quote(&name),
            known: known(self.selectors),
        })?;
        Ok((path, kind, name))
    }
}

fn unsupported(what: &str) -> FilterError {
    FilterError::Unsupported {
        what: format!("the operator {}", quote(what)),
    }
}

/// The route's selectors, for an error.
fn known(selectors: Selectors) -> String {
    selectors
        .iter()
        .map(|(s, k)| match k {
            Kind::Map => format!("{s}, {s}.<key>"),
            _ => (*s).to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What `path` reaches among `selectors`: one of them, or a key of one
/// that is a map.
fn resolve(path: &[String], selectors: Selectors) -> Option<Kind> {
    let same = |sel: &str, path: &[String]| sel.split('.').eq(path.iter().map(String::as_str));
    if let Some((_, kind)) = selectors.iter().find(|(s, _)| same(s, path)) {
        return Some(*kind);
    }
    let (_, parent) = path.split_last()?;
    selectors
        .iter()
        .any(|(s, k)| *k == Kind::Map && same(s, parent))
        .then_some(Kind::Text)
}

/// A match, refused when `op` does not apply to what the selector reaches.
fn check(
    path: Vec<String>,
    kind: Kind,
    name: &str,
    op: Op,
    value: Option<String>,
) -> Result<Expr, FilterError> {
    if !op.takes(kind) {
        return Err(FilterError::Operator {
            selector: quote(name),
            kind: kind.name(),
            op: op.name(),
        });
    }
    if let (Kind::Number, Some(v)) = (kind, &value) {
        if v.parse::<f64>().is_err() {
            return Err(FilterError::Operator {
                selector: quote(name),
                kind: kind.name(),
                op: "comparing with a value that is not a number",
            });
        }
    }
    Ok(Expr::Match { path, op, value })
}
