//! Consul's `?filter=` expressions, the subset tools use: `==`, `!=`,
//! `contains`, `not contains`, `in`, `not in`, `is empty`, `is not empty`,
//! joined with `not`, `and`, `or` and parentheses; values quoted with
//! double quotes (escapes read) or backticks (raw), or bare words and
//! numbers. Each route takes the selectors Consul documents for it
//! ([`Selectors`]): an unknown selector, an operator its value does not
//! take (`==` on a list) or anything outside the subset (`matches`, `>`)
//! is refused with the part at fault named.
//!
//! An expression is evaluated on the JSON of one entry of the answer, as
//! Consul evaluates it on the entry it returns:
//! - on text: `==` and `!=` compare, `contains`/`in` look for a substring;
//! - on a list (`Service.Tags`): `contains`/`in` look for an element;
//! - on a map (`Service.Meta`): `contains`/`in` look for a key, and
//!   `Meta.KEY` or `Meta["KEY"]` select a value;
//! - a selector that passes through a list of objects (`Checks.Status`)
//!   holds when the match holds for any of them (`Checks.Status !=
//!   "passing"`: some check is not passing);
//! - a selector whose value is absent (`Meta.KEY` without that key) reads
//!   as empty: `==` and `contains` do not hold, `!=`, `not contains` and
//!   `is empty` do.

use serde_json::Value;

mod parse;

pub(crate) use parse::FilterError;

/// The longest filter taken, in bytes.
pub(crate) const MAX_FILTER_BYTES: usize = 4096;

/// What a selector reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A string.
    Text,
    /// A number (`==` and `!=` only).
    Number,
    /// A list of strings.
    List,
    /// A map of strings: `Sel.KEY` and `Sel["KEY"]` select a value.
    Map,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Text => "text",
            Kind::Number => "a number",
            Kind::List => "a list",
            Kind::Map => "a map",
        }
    }
}

/// The selectors a route takes, by Consul's names, with what each reaches.
pub(crate) type Selectors = &'static [(&'static str, Kind)];

/// `GET /v1/health/service/<name>`: one entry per instance.
pub(crate) const HEALTH_SERVICE: Selectors = &[
    ("Node.Node", Kind::Text),
    ("Node.Address", Kind::Text),
    ("Node.Datacenter", Kind::Text),
    ("Node.TaggedAddresses", Kind::Map),
    ("Node.Meta", Kind::Map),
    ("Service.ID", Kind::Text),
    ("Service.Service", Kind::Text),
    ("Service.Tags", Kind::List),
    ("Service.Address", Kind::Text),
    ("Service.Port", Kind::Number),
    ("Service.Meta", Kind::Map),
    ("Service.Weights.Passing", Kind::Number),
    ("Service.Weights.Warning", Kind::Number),
    ("Checks.CheckID", Kind::Text),
    ("Checks.Name", Kind::Text),
    ("Checks.Node", Kind::Text),
    ("Checks.Status", Kind::Text),
    ("Checks.Notes", Kind::Text),
    ("Checks.Output", Kind::Text),
    ("Checks.ServiceID", Kind::Text),
    ("Checks.ServiceName", Kind::Text),
    ("Checks.ServiceTags", Kind::List),
    ("Checks.Type", Kind::Text),
];

/// `GET /v1/catalog/service/<name>` and `/v1/catalog/services`: one entry
/// per instance.
pub(crate) const CATALOG_SERVICE: Selectors = &[
    ("Node", Kind::Text),
    ("Address", Kind::Text),
    ("Datacenter", Kind::Text),
    ("TaggedAddresses", Kind::Map),
    ("NodeMeta", Kind::Map),
    ("ServiceID", Kind::Text),
    ("ServiceName", Kind::Text),
    ("ServiceTags", Kind::List),
    ("ServiceAddress", Kind::Text),
    ("ServicePort", Kind::Number),
    ("ServiceMeta", Kind::Map),
    ("ServiceWeights.Passing", Kind::Number),
    ("ServiceWeights.Warning", Kind::Number),
];

/// `GET /v1/catalog/nodes`: one entry per node.
pub(crate) const NODES: Selectors = &[
    ("ID", Kind::Text),
    ("Node", Kind::Text),
    ("Address", Kind::Text),
    ("Datacenter", Kind::Text),
    ("TaggedAddresses", Kind::Map),
    ("Meta", Kind::Map),
];

/// `GET /v1/agent/services` and the services of
/// `GET /v1/catalog/node/<node>`.
pub(crate) const SERVICES: Selectors = &[
    ("ID", Kind::Text),
    ("Service", Kind::Text),
    ("Tags", Kind::List),
    ("Address", Kind::Text),
    ("Port", Kind::Number),
    ("Meta", Kind::Map),
    ("Weights.Passing", Kind::Number),
    ("Weights.Warning", Kind::Number),
    ("Datacenter", Kind::Text),
];

/// Lists of checks: `GET /v1/health/node/<node>`, `/v1/health/state/<s>`,
/// `/v1/health/checks/<service>`, `/v1/agent/checks`.
pub(crate) const CHECKS: Selectors = &[
    ("Node", Kind::Text),
    ("CheckID", Kind::Text),
    ("Name", Kind::Text),
    ("Status", Kind::Text),
    ("Notes", Kind::Text),
    ("Output", Kind::Text),
    ("ServiceID", Kind::Text),
    ("ServiceName", Kind::Text),
    ("ServiceTags", Kind::List),
    ("Type", Kind::Text),
];

/// A match operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    /// `contains`, or `in` with its operands the other way round.
    Contains,
    NotContains,
    IsEmpty,
    IsNotEmpty,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Eq => "==",
            Op::Ne => "!=",
            Op::Contains => "contains (or in)",
            Op::NotContains => "not contains (or not in)",
            Op::IsEmpty => "is empty",
            Op::IsNotEmpty => "is not empty",
        }
    }

    /// Whether it holds of an absent value.
    fn of_absent(self) -> bool {
        matches!(self, Op::Ne | Op::NotContains | Op::IsEmpty)
    }

    fn takes(self, kind: Kind) -> bool {
        match kind {
            Kind::Text => true,
            Kind::Number => matches!(self, Op::Eq | Op::Ne),
            Kind::List | Kind::Map => !matches!(self, Op::Eq | Op::Ne),
        }
    }
}

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Not(Box<Expr>),
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Match {
        /// The selector's path (`Service.Meta["a.b"]`: `Service`, `Meta`,
        /// `a.b`).
        path: Vec<String>,
        op: Op,
        /// The value (`None` for `is empty`).
        value: Option<String>,
    },
}

/// A filter, parsed and checked against a route's selectors.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Filter {
    expr: Expr,
}

impl Filter {
    /// Parse `text` for a route that takes `selectors`.
    pub(crate) fn parse(text: &str, selectors: Selectors) -> Result<Self, FilterError> {
        parse::parse(text, selectors).map(|expr| Self { expr })
    }

    /// Whether `entry` (one entry of an answer, as JSON) passes.
    pub(crate) fn matches(&self, entry: &Value) -> bool {
        eval(&self.expr, entry)
    }

    /// The entries of `all` that pass (an entry that cannot be rendered as
    /// JSON does not).
    pub(crate) fn keep<T: serde::Serialize>(&self, all: Vec<T>) -> Vec<T> {
        all.into_iter().filter(|e| passes(self, e)).collect()
    }
}

/// Whether `f` keeps `entry` (one that cannot be rendered as JSON it
/// does not).
pub(crate) fn passes<T: serde::Serialize>(f: &Filter, entry: &T) -> bool {
    serde_json::to_value(entry).is_ok_and(|v| f.matches(&v))
}

/// The entries of `all` that `filter` keeps (all without one).
pub(crate) fn keep<T: serde::Serialize>(filter: Option<&Filter>, all: Vec<T>) -> Vec<T> {
    match filter {
        Some(f) => f.keep(all),
        None => all,
    }
}

fn eval(expr: &Expr, entry: &Value) -> bool {
    match expr {
        Expr::Not(e) => !eval(e, entry),
        Expr::And(a, b) => eval(a, entry) && eval(b, entry),
        Expr::Or(a, b) => eval(a, entry) || eval(b, entry),
        Expr::Match { path, op, value } => select(entry, path, *op, value.as_deref()),
    }
}

/// Whether the match holds of what `path` reaches from `v`.
fn select(v: &Value, path: &[String], op: Op, value: Option<&str>) -> bool {
    let Some((head, rest)) = path.split_first() else {
        return apply(v, op, value.unwrap_or_default());
    };
    match v {
        Value::Array(items) => items.iter().any(|i| select(i, path, op, value)),
        Value::Object(m) => match m.get(head) {
            Some(next) => select(next, rest, op, value),
            None => op.of_absent(),
        },
        _ => op.of_absent(),
    }
}

/// Whether `op` with `value` holds of `v`.
fn apply(v: &Value, op: Op, value: &str) -> bool {
    let holds = match (v, op) {
        (Value::Null, _) => return op.of_absent(),
        (_, Op::IsEmpty | Op::IsNotEmpty) => {
            let empty = match v {
                Value::String(s) => s.is_empty(),
                Value::Array(a) => a.is_empty(),
                Value::Object(m) => m.is_empty(),
                _ => false,
            };
            return empty == (op == Op::IsEmpty);
        }
        (Value::String(s), Op::Eq | Op::Ne) => s == value,
        (Value::Number(n), Op::Eq | Op::Ne) => {
            value.parse::<f64>().is_ok_and(|x| n.as_f64() == Some(x))
        }
        (Value::Bool(b), Op::Eq | Op::Ne) => {
            crate::faces::http::query::parse_bool(value) == Some(*b)
        }
        (Value::String(s), _) => s.contains(value),
        (Value::Array(items), _) => items.iter().any(|i| match i {
            Value::String(s) => s == value,
            other => *other == value,
        }),
        (Value::Object(m), _) => m.contains_key(value),
        _ => false,
    };
    match op {
        Op::Eq | Op::Contains => holds,
        _ => !holds,
    }
}

#[cfg(test)]
mod tests;
