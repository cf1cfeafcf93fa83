//! A span's quality scores and its first-token time from its events, read off the parsed request.
//!
//! The Python reference (collector/span_scores.py) reads the same from the JSON the walk wrote; this
//! reads the KeyValues themselves, so the half of a fleet's spans that carry a score costs no JSON parse
//! and no interpreter. Where Python's own rules would decide a text this cannot cheaply reproduce bit for
//! bit (`str()` of a float or a list, `float()` of a non-ASCII or underscored string, a key a Python regex
//! reads differently), the span is handed back whole to the reference: `Scores::left`.

use std::sync::Arc;

use arrow_array::builder::{Float64Builder, StringBuilder};
use arrow_array::types::TimestampNanosecondType;
use arrow_array::{Int32Array, PrimitiveArray, RecordBatch};
use arrow_schema::{ArrowError, DataType, Field, Schema, TimeUnit};
use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue};
use opentelemetry_proto::tonic::trace::v1::Span;

use crate::json::{bytes_text, held, unique_entries, Entry, Order};

const EVALUATION_EVENT: &str = "gen_ai.evaluation.result";
const OI_FIRST_TOKEN_EVENT: &str = "First Token Stream Event";
const CHUNK_EVENT: &str = "gen_ai.content.completion.chunk";
const MAX_TIME_NS: u64 = (1 << 63) - 1;

/// A text Python would read differently from a plain reading here: the span goes to the reference.
struct Hand;

type Read<T> = Result<T, Hand>;

/// A value as the reference sees it after a JSON round trip.
enum Py<'a> {
    None,
    Str(std::borrow::Cow<'a, str>),
    Int(i64),
    Float(f64),
    Bool(bool),
    Other,
}

fn py(value: Option<&AnyValue>) -> Py<'_> {
    match held(value) {
        None => Py::None,
        Some(Value::StringValue(s)) => Py::Str(s.as_str().into()),
        Some(Value::BytesValue(b)) => Py::Str(bytes_text(b).into()),
        Some(Value::IntValue(i)) => Py::Int(*i),
        // The walk writes NaN and infinities as null.
        Some(Value::DoubleValue(d)) if d.is_finite() => Py::Float(*d),
        Some(Value::DoubleValue(_)) => Py::None,
        Some(Value::BoolValue(b)) => Py::Bool(*b),
        Some(_) => Py::Other,
    }
}

/// Python's `float(text)`, finite, for the ASCII texts whose grammar Rust's parser shares.
fn parse_number(text: &str) -> Read<Option<f64>> {
    let plain = text
        .bytes()
        .all(|b| (0x20..0x7f).contains(&b) || matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r'));
    if !plain || text.contains('_') {
        return Err(Hand);
    }
    let trimmed = text.trim_matches(|c| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r'));
    Ok(trimmed.parse::<f64>().ok().filter(|v| v.is_finite()))
}

/// `collector.scores._number`: a pass/fail boolean scores 1 or 0.
fn number(value: &Py<'_>) -> Read<Option<f64>> {
    Ok(match value {
        Py::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        Py::Int(i) => Some(*i as f64),
        Py::Float(f) => Some(*f),
        Py::Str(s) => return parse_number(s),
        Py::None | Py::Other => None,
    })
}

/// `collector.scores._text`: Python's `str()`; a float's or a list's is the reference's to write.
fn text(value: &Py<'_>) -> Read<Option<String>> {
    Ok(match value {
        Py::None => None,
        Py::Str(s) => Some(s.to_string()),
        Py::Int(i) => Some(i.to_string()),
        Py::Bool(b) => Some(if *b { "True" } else { "False" }.to_string()),
        Py::Float(_) | Py::Other => return Err(Hand),
    })
}

struct Score {
    trace_id: String,
    span_id: String,
    name: String,
    score: Option<f64>,
    label: Option<String>,
    explanation: Option<String>,
    source: &'static str,
    observed_ns: i64,
}

fn get<'a>(entries: &[Entry<'a>], key: &str) -> Option<&'a AnyValue> {
    entries.iter().find(|e| e.0 == key).and_then(|e| e.1)
}

/// `collector.scores.from_evaluation`.
fn evaluation(
    entries: &[Entry<'_>],
    trace_id: &str,
    span_id: &str,
    source: &'static str,
    observed_ns: i64,
) -> Read<Option<Score>> {
    let name = match py(get(entries, "gen_ai.evaluation.name")) {
        Py::Str(s) if !s.is_empty() => s.to_string(),
        _ => return Ok(None),
    };
    let mut span_id = span_id.to_string();
    if let Py::Str(target) = py(get(entries, "gen_ai.evaluation.target_span_id")) {
        if !target.is_ascii() {
            return Err(Hand); // Python counts code points and lowers Unicode
        }
        if target.len() == 16 {
            span_id = target.to_ascii_lowercase();
        }
    }
    Ok(Some(Score {
        trace_id: trace_id.to_string(),
        span_id,
        name,
        score: number(&py(get(entries, "gen_ai.evaluation.score.value")))?,
        label: text(&py(get(entries, "gen_ai.evaluation.score.label")))?,
        explanation: text(&py(get(entries, "gen_ai.evaluation.explanation")))?,
        source,
        observed_ns,
    }))
}

/// The fields an indexed (OpenInference) or plain (`eval.<name>`) score collects, in first-seen order.
#[derive(Default)]
struct Fields<'a> {
    name: Option<Option<&'a AnyValue>>,
    score: Option<Option<&'a AnyValue>>,
    value: Option<Option<&'a AnyValue>>,
    label: Option<Option<&'a AnyValue>>,
    explanation: Option<Option<&'a AnyValue>>,
}

impl<'a> Fields<'a> {
    fn set(&mut self, field: &str, value: Option<&'a AnyValue>) {
        let slot = match field {
            "name" => &mut self.name,
            "score" => &mut self.score,
            "label" => &mut self.label,
            "explanation" => &mut self.explanation,
            _ => &mut self.value,
        };
        *slot = Some(value);
    }
}

fn field(slot: Option<Option<&AnyValue>>) -> Py<'_> {
    slot.map_or(Py::None, py)
}

fn entry<'g, 'k, 'a>(
    groups: &'g mut Vec<(&'k str, Fields<'a>)>,
    key: &'k str,
) -> &'g mut Fields<'a> {
    match groups.iter().position(|g| g.0 == key) {
        Some(i) => &mut groups[i].1,
        None => {
            groups.push((key, Fields::default()));
            &mut groups.last_mut().expect("just pushed").1
        }
    }
}

/// `evaluations.<i>.evaluation.<field>` / `annotations.<i>.annotation.<field>` (either inner word): the group
/// (prefix and index, as text) and the field.
fn indexed_key(key: &str) -> Option<(&str, &str)> {
    let (prefix, rest) = key.split_once('.')?;
    if prefix != "evaluations" && prefix != "annotations" {
        return None;
    }
    let (index, rest) = rest.split_once('.')?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (inner, field) = rest.split_once('.')?;
    if (inner != "evaluation" && inner != "annotation")
        || !matches!(field, "name" | "score" | "label" | "explanation")
    {
        return None;
    }
    Some((&key[..prefix.len() + 1 + index.len()], field))
}

/// `eval.<name>[.score|.label|.explanation]`: the name and the field ("value" without a suffix).
fn plain_key(key: &str) -> Option<(&str, &str)> {
    let rest = key.strip_prefix("eval.")?;
    for suffix in ["score", "label", "explanation"] {
        if let Some(name) = rest.strip_suffix(suffix).and_then(|r| r.strip_suffix('.')) {
            if !name.is_empty() {
                return Some((name, suffix));
            }
        }
    }
    (!rest.is_empty()).then_some((rest, "value"))
}

const SCORE_PREFIXES: [&str; 4] = [
    "eval.",
    "gen_ai.evaluation.",
    "evaluations.",
    "annotations.",
];

/// `collector.scores.from_span_attributes`, on the span's unique attributes in stored (sorted) order.
fn from_attributes(
    entries: &[Entry<'_>],
    trace_id: &str,
    span_id: &str,
    observed_ns: i64,
    out: &mut Vec<Score>,
) -> Read<()> {
    if let Some(score) = evaluation(entries, trace_id, span_id, "attribute", observed_ns)? {
        out.push(score);
    }
    let mut indexed: Vec<(&str, Fields<'_>)> = Vec::new();
    let mut plain: Vec<(&str, Fields<'_>)> = Vec::new();
    for (key, value) in entries {
        if key.starts_with("evaluations.") || key.starts_with("annotations.") {
            if let Some((group, f)) = indexed_key(key) {
                entry(&mut indexed, group).set(f, *value);
            }
        } else if key.starts_with("eval.") {
            if let Some((name, f)) = plain_key(key) {
                entry(&mut plain, name).set(f, *value);
            }
        }
    }
    for (_, fields) in &indexed {
        if let Py::Str(name) = field(fields.name) {
            if name.is_empty() {
                continue;
            }
            let at = (trace_id, span_id, observed_ns);
            push_attribute_score(out, at, &name, fields.score, fields)?;
        }
    }
    for (name, fields) in &plain {
        // A `.score` present wins over the bare key, even when it holds nothing.
        let raw = if fields.score.is_some() {
            fields.score
        } else {
            fields.value
        };
        push_attribute_score(out, (trace_id, span_id, observed_ns), name, raw, fields)?;
    }
    Ok(())
}

/// One score read from attributes, kept when it holds a number or a label.
fn push_attribute_score(
    out: &mut Vec<Score>,
    (trace_id, span_id, observed_ns): (&str, &str, i64),
    name: &str,
    raw: Option<Option<&AnyValue>>,
    fields: &Fields<'_>,
) -> Read<()> {
    let score = number(&field(raw))?;
    let label = text(&field(fields.label))?;
    if score.is_some() || label.is_some() {
        out.push(Score {
            trace_id: trace_id.to_string(),
            span_id: span_id.to_string(),
            name: name.to_string(),
            score,
            label,
            explanation: text(&field(fields.explanation))?,
            source: "attribute",
            observed_ns,
        });
    }
    Ok(())
}

/// The scores of the accepted spans in row order, the spans left to the reference, and each span's
/// first-token time from its events.
#[derive(Default)]
pub struct Scores {
    found: Vec<(i32, Score)>,
    pub left: Vec<i32>,
    first_token_ms: Float64Builder,
    scratch: Vec<Score>,
}

impl Scores {
    /// One accepted span: `attrs` its unique attributes, sorted; `row` its row among the accepted.
    pub fn add(&mut self, s: &Span, attrs: &[Entry<'_>], trace_id: &str, span_id: &str, row: i32) {
        self.first_token_ms.append_option(first_token_ms(s));
        let end = s.end_time_unix_nano as i64; // checked below 2^63 by the walk
        self.scratch.clear();
        let mut scratch = std::mem::take(&mut self.scratch);
        let read = span_scores(s, attrs, trace_id, span_id, end, &mut scratch);
        match read {
            Ok(()) => self
                .found
                .extend(scratch.drain(..).map(|score| (row, score))),
            Err(Hand) => self.left.push(row),
        }
        self.scratch = scratch;
    }

    /// (scores with each one's row, the first-token times from events).
    pub fn finish(mut self) -> Result<(RecordBatch, RecordBatch), ArrowError> {
        let n = self.found.len();
        let mut trace_id = StringBuilder::with_capacity(n, n * 32);
        let mut span_id = StringBuilder::with_capacity(n, n * 16);
        let mut name = StringBuilder::new();
        let mut score = Float64Builder::with_capacity(n);
        let mut label = StringBuilder::new();
        let mut explanation = StringBuilder::new();
        let mut source = StringBuilder::new();
        let mut observed = Vec::with_capacity(n);
        let mut rows = Vec::with_capacity(n);
        for (row, s) in self.found {
            trace_id.append_value(&s.trace_id);
            span_id.append_value(&s.span_id);
            name.append_value(&s.name);
            score.append_option(s.score);
            label.append_option(s.label);
            explanation.append_option(s.explanation);
            source.append_value(s.source);
            observed.push(s.observed_ns);
            rows.push(row);
        }
        let text = |n: &str| Field::new(n, DataType::Utf8, true);
        let schema = Schema::new(vec![
            text("trace_id"),
            text("span_id"),
            text("name"),
            Field::new("score", DataType::Float64, true),
            text("label"),
            text("explanation"),
            text("source"),
            Field::new(
                "observed_at",
                DataType::Timestamp(TimeUnit::Nanosecond, None),
                true,
            ),
            Field::new("row", DataType::Int32, false),
        ]);
        let scores = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(trace_id.finish()),
                Arc::new(span_id.finish()),
                Arc::new(name.finish()),
                Arc::new(score.finish()),
                Arc::new(label.finish()),
                Arc::new(explanation.finish()),
                Arc::new(source.finish()),
                Arc::new(PrimitiveArray::<TimestampNanosecondType>::from(observed)),
                Arc::new(Int32Array::from(rows)),
            ],
        )?;
        let first = RecordBatch::try_new(
            Arc::new(Schema::new(vec![Field::new(
                "first_token_ms",
                DataType::Float64,
                true,
            )])),
            vec![Arc::new(self.first_token_ms.finish())],
        )?;
        Ok((scores, first))
    }
}

fn span_scores(
    s: &Span,
    attrs: &[Entry<'_>],
    trace_id: &str,
    span_id: &str,
    end: i64,
    out: &mut Vec<Score>,
) -> Read<()> {
    let scored: Vec<Entry<'_>> = attrs
        .iter()
        .filter(|e| SCORE_PREFIXES.iter().any(|p| e.0.starts_with(p)))
        .copied()
        .collect();
    if !scored.is_empty() {
        // The reference matches keys with Python regexes (`\d` is any Unicode digit, `$` passes a final
        // newline): only plain ASCII keys read the same here.
        if scored
            .iter()
            .any(|e| !e.0.bytes().all(|b| (0x20..0x7f).contains(&b)))
        {
            return Err(Hand);
        }
        // OpenInference feedback arrives on a carrier span linked to the span it judges.
        let (mut on_trace, mut on_span) = (trace_id.to_string(), span_id.to_string());
        let kind = attrs
            .iter()
            .find(|e| e.0 == "openinference.span.kind")
            .and_then(|e| e.1);
        if s.links.len() == 1 && matches!(py(kind), Py::Str(k) if k == "EVALUATOR") {
            on_trace = crate::walk::hex(&s.links[0].trace_id);
            on_span = crate::walk::hex(&s.links[0].span_id);
        }
        from_attributes(&scored, &on_trace, &on_span, end, out)?;
    }
    for event in &s.events {
        if event.name == EVALUATION_EVENT {
            // An event time storage cannot hold is as good as none: the score is the span's.
            let t = event.time_unix_nano;
            let at = if t > 0 && t <= MAX_TIME_NS {
                t as i64
            } else {
                end
            };
            let entries = unique_entries(&event.attributes, Order::Sent);
            if let Some(score) = evaluation(&entries, trace_id, span_id, "event", at)? {
                out.push(score);
            }
        }
    }
    Ok(())
}

/// `collector.normalize.first_token_ms` from events alone: OpenInference's first-token event, else the
/// earliest completion chunk at or after the span's start.
fn first_token_ms(s: &Span) -> Option<f64> {
    let start = s.start_time_unix_nano;
    let mut first_chunk: Option<u64> = None;
    for event in &s.events {
        let t = event.time_unix_nano;
        if t < start {
            continue;
        }
        if event.name == OI_FIRST_TOKEN_EVENT {
            return Some((t - start) as f64 / 1e6);
        }
        if event.name == CHUNK_EVENT && first_chunk.is_none_or(|f| t < f) {
            first_chunk = Some(t);
        }
    }
    first_chunk.map(|t| (t - start) as f64 / 1e6)
}
