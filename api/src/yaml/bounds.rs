//! The bounds every YAML document is checked against before serde_norway
//! builds a value from it, in one pass of libyaml's own event parser (the one
//! under serde_norway, so the check and the parser cannot disagree on what a
//! document holds):
//!
//! - **Nesting**: no node may sit more than [`MAX_DEPTH`] collections deep,
//!   counting through aliases, which is serde_norway's recursion limit. The
//!   pass stops at the first node past it, so the parser's scan never runs
//!   deep: libyaml checks every open flow level at every token, and a deep
//!   nesting costs time quadratic in its depth (100 KB of `[` took 5 s).
//! - **Expanded size**: serde_norway copies an aliased node for every alias
//!   (one anchored 1 MiB scalar and 1,000 aliases made 1 GiB), and its own
//!   repetition limit counts events, not bytes. Here every node costs one
//!   byte plus the bytes of its scalar, and an alias costs what its anchored
//!   node costs; what aliases add may be at most the document's own size, or
//!   [`MIN_ALIAS_BUDGET`] if the document is smaller. Memory stays linear in
//!   the input whatever the aliases, and the anchors Kubernetes manifests use
//!   (a shared label set, a repeated container spec) fit many times over.
//!   An alias inside the node it names is refused (serde_norway would follow
//!   it until its recursion limit).
//!
//! A second document is refused when it starts, before it is parsed. A
//! syntax error ends the pass without an error: the parser then reports it,
//! having read no further than this pass did.

use std::collections::HashMap;
use std::ffi::CStr;
use std::mem::MaybeUninit;

use unsafe_libyaml_norway as unsafe_libyaml;

use crate::text;

/// The deepest a node may be nested in collections (sequences and mappings,
/// flow or block, aliases followed): serde_norway's recursion limit.
pub const MAX_DEPTH: usize = 128;

/// The most bytes aliases may add to a document smaller than this; a larger
/// document's aliases may add as many bytes as it has.
pub const MIN_ALIAS_BUDGET: u64 = 1 << 20;

/// The bytes aliases may add to a document of `len` bytes.
pub fn alias_budget(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX).max(MIN_ALIAS_BUDGET)
}

/// Why a document was refused before it was parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BoundsError {
    #[error("YAML nodes are nested more than {MAX_DEPTH} deep (line {line})")]
    TooDeep { line: u64 },
    #[error(
        "YAML aliases expand the document by more than {budget} bytes (line {line}): \
         aliases may add at most the document's own size, or {MIN_ALIAS_BUDGET} bytes"
    )]
    AliasBudget { budget: u64, line: u64 },
    #[error("YAML alias *{anchor} refers to the node that contains it (line {line})")]
    RecursiveAlias { anchor: String, line: u64 },
    #[error("more than one document (the second starts at line {line})")]
    MoreThanOneDocument { line: u64 },
}

/// What an anchor names, once its node is complete.
#[derive(Clone, Copy)]
enum Anchored {
    /// The node is still open: an alias to it would recurse.
    Open,
    /// Its expanded size and how many collections deep it goes.
    Done { size: u64, depth: usize },
}

/// A collection being read.
struct Open {
    anchor: Option<Vec<u8>>,
    /// The document's expanded size when it started.
    start: u64,
    /// The deepest nesting below it so far (0: none).
    below: usize,
}

/// Checks `doc` against [`MAX_DEPTH`] and the alias budget (see the module
/// documentation).
pub fn check(doc: &[u8]) -> Result<(), BoundsError> {
    check_documents(doc, false)
}

/// [`check`] for a stream of documents separated by `---` (a file of a KRM
/// package, or `kpt fn eval -`'s stdin): every document is bounded as one,
/// and what aliases add is counted over the whole stream, against the
/// stream's size.
pub fn check_stream(doc: &[u8]) -> Result<(), BoundsError> {
    check_documents(doc, true)
}

fn check_documents(doc: &[u8], stream: bool) -> Result<(), BoundsError> {
    let mut events = Events::new(doc);
    let budget = alias_budget(doc.len());
    let mut anchors: HashMap<Vec<u8>, Anchored> = HashMap::new();
    let mut stack: Vec<Open> = Vec::new();
    let (mut size, mut added, mut documents) = (0u64, 0u64, 0usize);
    // A node of `depth` collections (0 for a scalar) completed at the
    // current level.
    let complete = |stack: &mut Vec<Open>, depth: usize| {
        if let Some(parent) = stack.last_mut() {
            parent.below = parent.below.max(depth);
        }
    };
    while let Some(event) = events.next() {
        let line = event.line;
        match event.kind {
            Kind::DocumentStart => {
                documents += 1;
                if documents > 1 && !stream {
                    return Err(BoundsError::MoreThanOneDocument { line });
                }
            }
            Kind::Scalar { anchor, len } => {
                let node = 1 + len;
                size = size.saturating_add(node);
                if let Some(anchor) = anchor {
                    anchors.insert(
                        anchor,
                        Anchored::Done {
                            size: node,
                            depth: 0,
                        },
                    );
                }
                complete(&mut stack, 0);
            }
            Kind::Start { anchor } => {
                if stack.len() + 1 > MAX_DEPTH {
                    return Err(BoundsError::TooDeep { line });
                }
                if let Some(anchor) = &anchor {
                    anchors.insert(anchor.clone(), Anchored::Open);
                }
                size = size.saturating_add(1);
                stack.push(Open {
                    anchor,
                    start: size - 1,
                    below: 0,
                });
            }
            Kind::End => {
                let Some(open) = stack.pop() else { continue };
                let depth = open.below + 1;
                if let Some(anchor) = open.anchor {
                    let node = size - open.start;
                    // A later anchor of the same name inside this node has
                    // replaced it; the name now means that one.
                    if let Some(entry @ Anchored::Open) = anchors.get_mut(&anchor) {
                        *entry = Anchored::Done { size: node, depth };
                    }
                }
                complete(&mut stack, depth);
            }
            Kind::Alias { anchor } => match anchors.get(&anchor) {
                // An unknown anchor: the parser refuses it.
                None => return Ok(()),
                Some(Anchored::Open) => {
                    return Err(BoundsError::RecursiveAlias {
                        anchor: text::bounded(&String::from_utf8_lossy(&anchor), 64).into_owned(),
                        line,
                    });
                }
                Some(&Anchored::Done { size: node, depth }) => {
                    if stack.len() + depth > MAX_DEPTH {
                        return Err(BoundsError::TooDeep { line });
                    }
                    size = size.saturating_add(node);
                    added = added.saturating_add(node);
                    if added > budget {
                        return Err(BoundsError::AliasBudget { budget, line });
                    }
                    complete(&mut stack, depth);
                }
            },
        }
    }
    Ok(())
}

/// One event of libyaml's parser, as far as [`check`] needs it.
struct Event {
    kind: Kind,
    /// 1-based.
    line: u64,
}

enum Kind {
    DocumentStart,
    Scalar {
        anchor: Option<Vec<u8>>,
        len: u64,
    },
    /// A sequence or mapping starts.
    Start {
        anchor: Option<Vec<u8>>,
    },
    /// A sequence or mapping ends.
    End,
    Alias {
        anchor: Vec<u8>,
    },
}

/// libyaml's event parser over a byte slice; ends at the stream's end or at
/// the first error.
struct Events<'a> {
    // Boxed: libyaml keeps a pointer to the parser in the parser (its read
    // handler's data), so it must not move once its input is set.
    parser: Box<MaybeUninit<unsafe_libyaml::yaml_parser_t>>,
    _input: &'a [u8],
    done: bool,
}

impl<'a> Events<'a> {
    fn new(input: &'a [u8]) -> Self {
        let mut parser = Box::new(MaybeUninit::<unsafe_libyaml::yaml_parser_t>::uninit());
        // SAFETY: `parser` points to memory for a parser that
        // `yaml_parser_initialize` initialises (it fails only when it cannot
        // allocate, then the parser is zeroed and `done` keeps it unused but
        // for `yaml_parser_delete`, which accepts it). The input outlives the
        // parser: `Events` borrows it for `'a`, and the parser is deleted in
        // `drop`.
        let failed = unsafe {
            let p = parser.as_mut_ptr();
            let failed = unsafe_libyaml::yaml_parser_initialize(p).fail;
            if !failed {
                unsafe_libyaml::yaml_parser_set_encoding(p, unsafe_libyaml::YAML_UTF8_ENCODING);
                unsafe_libyaml::yaml_parser_set_input_string(p, input.as_ptr(), input.len() as _);
            }
            failed
        };
        Events {
            parser,
            _input: input,
            done: failed,
        }
    }

    fn next(&mut self) -> Option<Event> {
        loop {
            if self.done {
                return None;
            }
            let mut event = MaybeUninit::<unsafe_libyaml::yaml_event_t>::uninit();
            // SAFETY: the parser was initialised in `new` (`done` is set
            // otherwise) and is pinned in its box; `event` is written by
            // `yaml_parser_parse` when it succeeds and only then read, its
            // strings are NUL-terminated ones libyaml allocated, copied here
            // before `yaml_event_delete` frees them.
            let kind = unsafe {
                let p = self.parser.as_mut_ptr();
                if unsafe_libyaml::yaml_parser_parse(p, event.as_mut_ptr()).fail {
                    self.done = true;
                    return None;
                }
                let e = event.as_mut_ptr();
                let anchor = |ptr: *const u8| {
                    (!ptr.is_null()).then(|| CStr::from_ptr(ptr.cast()).to_bytes().to_vec())
                };
                let kind = match (*e).type_ {
                    unsafe_libyaml::YAML_STREAM_END_EVENT => {
                        self.done = true;
                        None
                    }
                    unsafe_libyaml::YAML_DOCUMENT_START_EVENT => Some(Kind::DocumentStart),
                    unsafe_libyaml::YAML_SCALAR_EVENT => Some(Kind::Scalar {
                        anchor: anchor((*e).data.scalar.anchor),
                        len: (*e).data.scalar.length,
                    }),
                    unsafe_libyaml::YAML_SEQUENCE_START_EVENT => Some(Kind::Start {
                        anchor: anchor((*e).data.sequence_start.anchor),
                    }),
                    unsafe_libyaml::YAML_MAPPING_START_EVENT => Some(Kind::Start {
                        anchor: anchor((*e).data.mapping_start.anchor),
                    }),
                    unsafe_libyaml::YAML_SEQUENCE_END_EVENT
                    | unsafe_libyaml::YAML_MAPPING_END_EVENT => Some(Kind::End),
                    unsafe_libyaml::YAML_ALIAS_EVENT => {
                        anchor((*e).data.alias.anchor).map(|anchor| Kind::Alias { anchor })
                    }
                    _ => None,
                };
                let line = (*e).start_mark.line + 1;
                unsafe_libyaml::yaml_event_delete(e);
                kind.map(|kind| Event { kind, line })
            };
            if let Some(event) = kind {
                return Some(event);
            }
        }
    }
}

impl Drop for Events<'_> {
    fn drop(&mut self) {
        // SAFETY: the parser was initialised in `new`, or zeroed by a failed
        // `yaml_parser_initialize`, which `yaml_parser_delete` accepts; it is
        // deleted once, here.
        unsafe { unsafe_libyaml::yaml_parser_delete(self.parser.as_mut_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_norway::Value;

    use super::*;

    /// What serde_norway makes of `doc`: `Ok` or its error message.
    fn parser(doc: &[u8]) -> Result<Value, String> {
        serde_norway::from_slice::<Value>(doc).map_err(|e| e.to_string())
    }

    /// `s: &s "aaa…"` (`len` bytes) and `n` aliases to it.
    fn alias_bomb(len: usize, n: usize) -> String {
        format!(
            "s: &s \"{}\"\nl: [{}]\n",
            "a".repeat(len),
            vec!["*s"; n].join(",")
        )
    }

    #[test]
    fn an_alias_bomb_is_refused_before_any_copy() {
        // 1 MiB and 1,000 aliases: 1 GiB once expanded.
        let doc = alias_bomb(1 << 20, 1000);
        let err = check(doc.as_bytes()).unwrap_err();
        assert_eq!(
            err,
            BoundsError::AliasBudget {
                budget: doc.len() as u64,
                line: 2
            }
        );
        assert!(
            err.to_string().starts_with(
                "YAML aliases expand the document by more than 1051590 bytes (line 2)"
            ),
            "{err}"
        );
        // Billion laughs: aliases of aliases.
        let mut doc = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let refs = vec![format!("*a{}", i - 1); 10].join(", ");
            doc.push_str(&format!("a{i}: &a{i} [{refs}]\n"));
        }
        assert!(matches!(
            check(doc.as_bytes()),
            Err(BoundsError::AliasBudget { .. })
        ));
    }

    #[test]
    fn aliases_within_the_budget_are_kept() {
        // What manifests do with anchors: shared labels, a repeated spec.
        let doc = "labels: &labels {app: web, tier: front}\n\
                   a: {metadata: {labels: *labels}}\n\
                   b: {metadata: {labels: *labels}}\n";
        check(doc.as_bytes()).unwrap();
        assert!(parser(doc.as_bytes()).is_ok());
        // Up to the budget: 1 MiB for a small document, and as many bytes
        // as the document has for a larger one.
        check(alias_bomb(1000, 1000).as_bytes()).unwrap();
        check(alias_bomb(4 << 20, 1).as_bytes()).unwrap();
        assert!(check(alias_bomb(4 << 20, 2).as_bytes()).is_err());
    }

    #[test]
    fn an_alias_inside_its_own_node_is_refused() {
        for doc in ["a: &x [1, *x]\n", "a: &x {k: [*x]}\n", "a: 1\nb: &a [*a]\n"] {
            assert!(
                matches!(
                    check(doc.as_bytes()),
                    Err(BoundsError::RecursiveAlias { .. })
                ),
                "{doc}"
            );
            assert!(parser(doc.as_bytes()).is_err(), "{doc}");
        }
        // A later anchor of the same name is a new node.
        let doc = "a: &x 1\nb: &x [*x]\n";
        assert!(check(doc.as_bytes()).is_err());
        let doc = "a: &x [1]\nb: &x [2]\nc: *x\n";
        check(doc.as_bytes()).unwrap();
        assert_eq!(
            parser(doc.as_bytes()).unwrap()["c"],
            parser(b"[2]").unwrap()
        );
    }

    #[test]
    fn nesting_is_bounded_as_the_parser_bounds_it() {
        let flow = |n: usize| format!("a: {}{}\n", "[".repeat(n), "]".repeat(n));
        // The mapping is one level: 127 more fit.
        check(flow(127).as_bytes()).unwrap();
        assert!(parser(flow(127).as_bytes()).is_ok());
        assert_eq!(
            check(flow(128).as_bytes()),
            Err(BoundsError::TooDeep { line: 1 })
        );
        assert!(
            parser(flow(128).as_bytes())
                .unwrap_err()
                .contains("recursion limit")
        );
        // Block nesting counts the same.
        let block: String = (0..130)
            .map(|i| format!("{}- x\n", "  ".repeat(i)))
            .collect();
        let block = block.replace("- x\n  ", "- ");
        assert!(matches!(
            check(block.as_bytes()),
            Err(BoundsError::TooDeep { .. })
        ));
        // So do aliases: 100 deep, aliased 100 deep.
        let doc = format!(
            "a: &d {}{}\nb: {}*d{}\n",
            "[".repeat(100),
            "]".repeat(100),
            "[".repeat(100),
            "]".repeat(100)
        );
        assert_eq!(check(doc.as_bytes()), Err(BoundsError::TooDeep { line: 2 }));
        assert!(
            parser(doc.as_bytes())
                .unwrap_err()
                .contains("recursion limit")
        );
    }

    /// Issue 18's bypass of the old hand-written pre-check: a `"` after `:`
    /// inside a flow sequence is part of a plain scalar, not a quote.
    #[test]
    fn a_quote_in_a_plain_scalar_does_not_hide_the_nesting() {
        let doc = format!(
            "config: [a:\",{}{}\n",
            "[".repeat(50_000),
            "]".repeat(50_000)
        );
        assert!(matches!(
            check(doc.as_bytes()),
            Err(BoundsError::TooDeep { line: 1 })
        ));
    }

    /// Issue 18: text in a block scalar is not nesting.
    #[test]
    fn brackets_in_block_scalars_do_not_count() {
        let doc = format!("data:\n  v: |\n    x\n    {}\n", "[".repeat(129));
        check(doc.as_bytes()).unwrap();
        assert!(parser(doc.as_bytes()).is_ok());
    }

    #[test]
    fn a_stream_is_bounded_document_by_document() {
        assert_eq!(check_stream(b"a: 1\n---\nb: [1]\n---\n"), Ok(()));
        let deep = format!("a: 1\n---\nb: {}\n", "[".repeat(1 << 20));
        assert!(matches!(
            check_stream(deep.as_bytes()),
            Err(BoundsError::TooDeep { .. })
        ));
        let bomb = format!("a: 1\n---\n{}", alias_bomb(1 << 16, 64));
        assert!(matches!(
            check_stream(bomb.as_bytes()),
            Err(BoundsError::AliasBudget { .. })
        ));
    }

    #[test]
    fn a_second_document_is_refused_when_it_starts() {
        let doc = format!("a: 1\n---\nb: {}\n", "[".repeat(100_000));
        assert_eq!(
            check(doc.as_bytes()),
            Err(BoundsError::MoreThanOneDocument { line: 2 })
        );
        check(b"a: 1\n...\n").unwrap();
        check(b"---\na: 1\n").unwrap();
    }

    /// Strings of YAML's structural characters, where the check and the
    /// parser are most likely to read a document differently.
    fn yaml_soup() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("["),
            Just("]"),
            Just("{"),
            Just("}"),
            Just("\""),
            Just("'"),
            Just(":"),
            Just(": "),
            Just(","),
            Just("#"),
            Just("\n"),
            Just("\n  "),
            Just("- "),
            Just("? "),
            Just("|\n"),
            Just(">\n"),
            Just("a"),
            Just("&a "),
            Just("*a"),
            Just("!t "),
            Just("\\"),
            Just("---\n"),
            Just("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["),
            Just("- - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - - "),
        ];
        proptest::collection::vec(piece, 0..64).prop_map(|v| v.concat())
    }

    /// Agreement with the parser: what the check refuses for nesting or
    /// recursion, the parser refuses too; what it passes, the parser never
    /// refuses for nesting.
    pub(crate) fn agrees_with_the_parser(doc: &[u8]) {
        let parsed = parser(doc);
        match check(doc) {
            Ok(()) => {
                if let Err(e) = &parsed {
                    assert!(!e.contains("recursion limit"), "{e}");
                }
            }
            Err(BoundsError::AliasBudget { .. }) => {}
            Err(e) => assert!(parsed.is_err(), "check: {e}; parser: {parsed:?}"),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        #[test]
        fn the_check_agrees_with_the_parser(doc in yaml_soup()) {
            agrees_with_the_parser(doc.as_bytes());
        }
    }
}
