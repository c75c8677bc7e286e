//! The crate's import graph, checked (issue 14, "stages depend only downward").
//!
//! Every `.rs` file under `src/` is parsed with `syn` and mapped to its module
//! (`src/a/b.rs` and `src/a/b/mod.rs` → `crate::a::b`; `src/main.rs`, the binary's root, →
//! `main`; inline `mod x {}` blocks count as part of their file; `#[cfg(test)]` modules and
//! items are left out). Every reference to another module of the crate — `use crate::…`,
//! `use super::…`, `use self::…`, `use child::…`, and paths in code or in macro arguments
//! such as `crate::x::f(…)`, `super::f`, `child::f`, `alias::f` — becomes an edge to the
//! deepest module the path names. Then:
//!
//! 1. the module graph (parent/child edges included) has no cycle;
//! 2. each top-level module imports only the top-level modules [`LAYERS`] lists for it, and
//!    stages never import each other;
//! 3. inside the model layer, each part (a folder of `src/model/` or a file directly in it)
//!    imports only the parts [`MODEL_PARTS`] lists for it.
//!
//! Run with `cargo test --test architecture -- --include-ignored --nocapture` to see the
//! graph's top-level edges and, while the layout is not there yet, every cycle and
//! violation.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::Path;

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::Visit;

/// Marks a top-level module that may import anything.
const ANY: &str = "*";

/// The stages: each runs one step of the pipeline; none may import another.
const STAGES: &[&str] = &[
    "ingest", "svd", "train", "predict", "evaluate", "report", "synth", "export", "serve",
];

/// What every stage may import: the stage protocol, the library modules, and the layers
/// below them.
const BELOW_STAGES: &[&str] = &[
    "stage",
    "sparse",
    "projection",
    "scoring",
    "trained",
    "portable",
    "metrics",
    "topk",
    "transform",
    "text",
    "model",
    "store",
    "linalg",
    "error",
    "memtrace",
    "alloc",
    "failpoint",
    "comm",
    "choice",
    "stop",
    "progress",
];

/// What the fit layer may import: the stages it runs and everything below them.
const FIT: &[&str] = &[
    "ingest",
    "svd",
    "train",
    "predict",
    "evaluate",
    "export",
    "stage",
    "sparse",
    "projection",
    "scoring",
    "trained",
    "portable",
    "metrics",
    "topk",
    "transform",
    "text",
    "model",
    "store",
    "linalg",
    "error",
    "memtrace",
    "alloc",
    "failpoint",
    "comm",
    "choice",
    "stop",
];

/// Top-level module → the top-level modules it may import. The one table of the layout:
/// add a module here when it is created, rename it here when it is renamed.
const LAYERS: &[(&str, &[&str])] = &[
    // The binary's root: parses the command line and hands it to the CLI layer.
    ("main", &["cli"]),
    // The clap layer (`pipeline run`'s spec handling lives under it too; `pipeline fit` is
    // the fit layer's command line).
    ("cli", &[ANY]),
    // Model selection within a budget: runs the stages through their typed options.
    ("fit", FIT),
    // The stages.
    ("ingest", BELOW_STAGES),
    ("svd", BELOW_STAGES),
    ("train", BELOW_STAGES),
    ("predict", BELOW_STAGES),
    ("evaluate", BELOW_STAGES),
    ("report", BELOW_STAGES),
    ("synth", BELOW_STAGES),
    ("export", BELOW_STAGES),
    ("serve", BELOW_STAGES),
    // The one stage protocol: memoised runs.
    (
        "stage",
        &[
            "store",
            "error",
            "memtrace",
            "failpoint",
            "comm",
            "choice",
            "progress",
        ],
    ),
    // Library modules shared by the stages.
    ("sparse", &["store"]),
    ("projection", &["sparse", "store", "linalg"]),
    (
        "scoring",
        &[
            "model",
            "store",
            "projection",
            "sparse",
            "topk",
            "trained",
            "progress",
        ],
    ),
    ("trained", &["model", "store", "choice"]),
    // A model file's typed contents: what scoring a new row needs without the workspace.
    (
        "portable",
        &[
            "model",
            "store",
            "trained",
            "transform",
            "scoring",
            "choice",
        ],
    ),
    ("metrics", &["store", "choice"]),
    ("topk", &[]),
    // Feature transforms: fitted on a training split, applied to one row at a time.
    ("transform", &["choice"]),
    // Input rows of text: the line reader and the row parser (ingest, `predict --input`).
    ("text", &["store", "error", "transform", "choice"]),
    // The model knows no files.
    ("model", &["linalg", "error", "choice"]),
    // Every on-disk format, the catalog, the workspace directory.
    // (`failpoint`: the writers fail midway through a file when a test arms them.)
    // (`stop`: the workspace carries the user's request to stop to every stage.)
    // (`progress`: a warning about files it keeps rather than deletes.)
    (
        "store",
        &["model", "error", "failpoint", "choice", "stop", "progress"],
    ),
    ("linalg", &[]),
    ("error", &[]),
    ("memtrace", &[]),
    // The C allocator's tunables for a phase's kind of work.
    ("alloc", &[]),
    // Fault injection for the crash and disk-full tests: reads one environment variable.
    ("failpoint", &[]),
    // The processes a stage runs on: one, or the ranks of an MPI job.
    ("comm", &[]),
    // Closed sets of named values, each declared once as a table (`choice_enum!`).
    ("choice", &[]),
    // A user's request to stop (Ctrl-C), polled by the stages at safe points.
    ("stop", &[]),
    // Typed progress events and the process-wide sink they go to; renderers live in `cli`.
    ("progress", &[]),
];

/// The model layer's parts (`src/model/`: a folder, or a file directly in it) → the parts
/// each may import; `src/model/mod.rs` only declares them. The second table of the layout
/// (`docs/model.md`, "Code map"): add a part here when it is created. Every part may use
/// `linalg` and `error` (the top-level table above).
const MODEL_PARTS: &[(&str, &[&str])] = &[
    // The per-caller arena of recycled work buffers.
    ("scratch", &[]),
    // Gauss–Hermite rules.
    ("quadrature", &[]),
    // Kernels through the basis and their input transforms (subspace ARD, feature ARD).
    ("kernel", &[]),
    // The Bernoulli links and the multi-class likelihoods, with the amortisation network.
    ("likelihood", &["quadrature"]),
    // The whole model state: the kernel's hyperparameters, the q(u) form, the network.
    ("params", &["kernel", "likelihood"]),
    // The q(u) forms and the conditional from any of them to the marginals at rows.
    ("qu", &["kernel", "params", "scratch"]),
    // The bound's terms and the bound with its gradients.
    (
        "bound",
        &["kernel", "likelihood", "params", "qu", "scratch"],
    ),
    // Adam.
    ("optim", &["kernel", "likelihood", "params"]),
    // Natural-gradient steps for the full-Cholesky q(u).
    ("natgrad", &["params", "qu"]),
    // Predictive moments and probabilities at new rows.
    (
        "predictive",
        &[
            "kernel",
            "likelihood",
            "params",
            "qu",
            "quadrature",
            "scratch",
        ],
    ),
];

/// The top-level module [`MODEL_PARTS`] divides.
const MODEL: &str = "model";

/// A module's path: `[]` is the library's root (`src/lib.rs`), `["main"]` the binary's.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Module(Vec<String>);

impl Module {
    fn root() -> Self {
        Module(Vec::new())
    }

    fn child(&self, name: &str) -> Self {
        let mut path = self.0.clone();
        path.push(name.to_string());
        Module(path)
    }

    /// The top-level module it belongs to (`crate` for the library's root).
    fn top(&self) -> &str {
        self.0.first().map_or("crate", String::as_str)
    }

    /// The part of `top` it belongs to (`crate::model::qu::sites` → `qu`); `None` outside
    /// `top` and for `top`'s own file.
    fn part_of(&self, top: &str) -> Option<&str> {
        match self.0.as_slice() {
            [first, part, ..] if first == top => Some(part),
            _ => None,
        }
    }

    fn starts_with(&self, prefix: &Module) -> bool {
        self.0.starts_with(&prefix.0)
    }
}

impl fmt::Display for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [] => write!(f, "crate"),
            [main] if main == BINARY_ROOT => write!(f, "main"),
            path => write!(f, "crate::{}", path.join("::")),
        }
    }
}

/// The module name given to `src/main.rs`.
const BINARY_ROOT: &str = "main";
/// The library's name, as the binary refers to it.
const LIBRARY: &str = "fsgp";

/// The crate's modules and the references between them.
#[derive(Debug, Default)]
struct Graph {
    /// Every module that has a file, with that file (relative to `src/`).
    files: BTreeMap<Module, String>,
    /// (from, to) → what makes the edge, e.g. `svd/mod.rs: use crate::train::Ranker`.
    edges: BTreeMap<(Module, Module), Vec<String>>,
}

/// The module a file under `src/` defines, from its path relative to `src/`.
fn module_of_file(relative: &str) -> Option<Module> {
    let stem = relative.strip_suffix(".rs")?;
    let mut parts: Vec<String> = stem.split('/').map(str::to_string).collect();
    match parts.as_slice() {
        [only] if only == "lib" => return Some(Module::root()),
        [only] if only == "main" => return Some(Module(vec![BINARY_ROOT.into()])),
        _ => {}
    }
    if parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    Some(Module(parts))
}

/// Whether `#[cfg(test)]` (or `#[cfg(all(…, test, …))]`) is among the attributes.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Meta>()
                .is_ok_and(|meta| meta_requires_test(&meta))
    })
}

fn meta_requires_test(meta: &syn::Meta) -> bool {
    match meta {
        syn::Meta::Path(path) => path.is_ident("test"),
        syn::Meta::List(list) if list.path.is_ident("all") => list
            .parse_args_with(
                syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
            )
            .is_ok_and(|metas| metas.iter().any(meta_requires_test)),
        _ => false,
    }
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    use syn::Item;
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// The paths a `use` tree imports, each with the name it binds (`None` for a glob).
fn flatten_use(
    tree: &syn::UseTree,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let extended = |ident: &syn::Ident| {
        let mut path = prefix.to_vec();
        path.push(ident.to_string());
        path
    };
    match tree {
        syn::UseTree::Path(p) => flatten_use(&p.tree, &extended(&p.ident), out),
        syn::UseTree::Name(n) if n.ident == "self" => {
            out.push((prefix.to_vec(), prefix.last().cloned()));
        }
        syn::UseTree::Name(n) => out.push((extended(&n.ident), Some(n.ident.to_string()))),
        syn::UseTree::Rename(r) if r.ident == "self" => {
            out.push((prefix.to_vec(), Some(r.rename.to_string())));
        }
        syn::UseTree::Rename(r) => out.push((extended(&r.ident), Some(r.rename.to_string()))),
        syn::UseTree::Glob(_) => out.push((prefix.to_vec(), None)),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                flatten_use(tree, prefix, out);
            }
        }
    }
}

/// Paths `a::b::c` written in a macro's tokens (format arguments, `vec![…]`, …).
fn paths_in_tokens(tokens: TokenStream, out: &mut Vec<Vec<String>>) {
    let mut current: Vec<String> = Vec::new();
    // Whether the tokens just read were `::`, so that the next identifier extends `current`.
    let mut after_colons = false;
    let mut pending_colon = false;
    let flush = |current: &mut Vec<String>, out: &mut Vec<Vec<String>>| {
        if current.len() >= 2 {
            out.push(std::mem::take(current));
        }
        current.clear();
    };
    for tree in tokens {
        match tree {
            TokenTree::Ident(ident) => {
                if !after_colons {
                    flush(&mut current, out);
                }
                current.push(ident.to_string());
                after_colons = false;
                pending_colon = false;
            }
            TokenTree::Punct(p) if p.as_char() == ':' && p.spacing() == Spacing::Joint => {
                pending_colon = !current.is_empty();
            }
            TokenTree::Punct(p) if p.as_char() == ':' && pending_colon => {
                after_colons = true;
                pending_colon = false;
            }
            TokenTree::Group(group) => {
                flush(&mut current, out);
                after_colons = false;
                pending_colon = false;
                paths_in_tokens(group.stream(), out);
            }
            _ => {
                flush(&mut current, out);
                after_colons = false;
                pending_colon = false;
            }
        }
    }
    flush(&mut current, out);
}

/// The names one module scope sees: its child modules and the modules it imported by name.
struct Scope {
    module: Module,
    children: BTreeSet<String>,
    aliases: BTreeMap<String, Module>,
}

/// Walks one file, recording its references to other modules.
struct Walker<'g> {
    file: &'g str,
    file_module: &'g Module,
    /// The modules that have a file.
    known: &'g BTreeSet<Module>,
    scopes: Vec<Scope>,
    /// (deepest module referred to, what refers to it).
    references: Vec<(Module, String)>,
}

impl Walker<'_> {
    fn scope(&self) -> &Scope {
        self.scopes.last().expect("walking inside a module scope")
    }

    /// The module path a path written in the current scope stands for, if it is one of
    /// this crate's (`None` for external crates, std, locals, generic parameters).
    fn absolute(&self, segments: &[String]) -> Option<Vec<String>> {
        let scope = self.scope();
        let first = segments.first()?;
        let in_binary = self.file_module.0.first().is_some_and(|m| m == BINARY_ROOT)
            && self.file_module.0.len() == 1;
        let (base, rest): (Vec<String>, &[String]) = match first.as_str() {
            "crate" if in_binary => (vec![BINARY_ROOT.into()], &segments[1..]),
            "crate" => (Vec::new(), &segments[1..]),
            LIBRARY => (Vec::new(), &segments[1..]),
            "self" => (scope.module.0.clone(), &segments[1..]),
            "super" => {
                let mut base = scope.module.0.clone();
                let supers = segments.iter().take_while(|s| *s == "super").count();
                for _ in 0..supers {
                    base.pop()?;
                }
                (base, &segments[supers..])
            }
            name if scope.children.contains(name) => (scope.module.child(name).0, &segments[1..]),
            name => (scope.aliases.get(name)?.0.clone(), &segments[1..]),
        };
        Some(base.into_iter().chain(rest.iter().cloned()).collect())
    }

    /// The deepest module that has a file along `path`.
    fn deepest(&self, path: &[String]) -> Module {
        (0..=path.len())
            .rev()
            .map(|n| Module(path[..n].to_vec()))
            .find(|m| self.known.contains(m))
            .unwrap_or_else(Module::root)
    }

    fn refer(&mut self, path: &[String], what: String) {
        let Some(absolute) = self.absolute(path) else {
            return;
        };
        let target = self.deepest(&absolute);
        if &target != self.file_module {
            self.references
                .push((target, format!("{}: {what}", self.file)));
        }
    }

    /// Walks a module scope: `items` of `module` (a file or an inline `mod x {}`).
    fn walk_items(&mut self, module: Module, items: &[syn::Item]) {
        let live = || items.iter().filter(|item| !is_test_only(item_attrs(item)));
        let children = live()
            .filter_map(|item| match item {
                syn::Item::Mod(m) => Some(m.ident.to_string()),
                _ => None,
            })
            .collect();
        self.scopes.push(Scope {
            module,
            children,
            aliases: BTreeMap::new(),
        });
        // Names bound by `use` may be used by other `use` items of the same scope, in any
        // order: two rounds settle one level of indirection (`use crate::store; use store::x`).
        let uses: Vec<(Vec<String>, Option<String>)> = live()
            .filter_map(|item| match item {
                syn::Item::Use(u) if u.leading_colon.is_none() => Some(u),
                _ => None,
            })
            .flat_map(|u| {
                let mut flat = Vec::new();
                flatten_use(&u.tree, &[], &mut flat);
                flat
            })
            .collect();
        for _ in 0..2 {
            for (path, binding) in &uses {
                let (Some(binding), Some(absolute)) = (binding, self.absolute(path)) else {
                    continue;
                };
                let module = Module(absolute);
                if self.known.contains(&module) {
                    self.scopes
                        .last_mut()
                        .expect("scope just pushed")
                        .aliases
                        .insert(binding.clone(), module);
                }
            }
        }
        for item in items {
            self.visit_item(item);
        }
        self.scopes.pop();
    }
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if is_test_only(&m.attrs) {
            return;
        }
        if let Some((_, items)) = &m.content {
            let inner = self.scope().module.child(&m.ident.to_string());
            self.walk_items(inner, items);
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        if is_test_only(&u.attrs) || u.leading_colon.is_some() {
            return;
        }
        let mut flat = Vec::new();
        flatten_use(&u.tree, &[], &mut flat);
        for (path, binding) in flat {
            let glob = if binding.is_none() { "::*" } else { "" };
            self.refer(&path, format!("use {}{glob}", path.join("::")));
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        // One segment is a local, a type or a function in scope, never a module's item.
        if path.leading_colon.is_none() && path.segments.len() >= 2 {
            let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.refer(&segments, segments.join("::"));
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        syn::visit::visit_macro(self, mac);
        let mut paths = Vec::new();
        paths_in_tokens(mac.tokens.clone(), &mut paths);
        for path in paths {
            self.refer(&path, format!("{} (in a macro)", path.join("::")));
        }
    }

    /// `pub(in crate::x)` restricts visibility; it imports nothing.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}
}

/// Builds the graph of `files`: (path relative to `src/`, source text) pairs.
fn build_graph(files: &[(String, String)]) -> Result<Graph, String> {
    let mut parsed = Vec::new();
    for (relative, source) in files {
        let Some(module) = module_of_file(relative) else {
            continue;
        };
        let ast = syn::parse_file(source).map_err(|e| format!("src/{relative}: {e}"))?;
        parsed.push((relative.as_str(), module, ast));
    }
    // Files of modules declared `#[cfg(test)] mod x;` are tests, not part of the graph.
    let mut test_modules = Vec::new();
    for (_, module, ast) in &parsed {
        collect_test_module_declarations(module, &ast.items, &mut test_modules);
    }
    parsed.retain(|(_, module, _)| !test_modules.iter().any(|t| module.starts_with(t)));

    let mut graph = Graph::default();
    for (relative, module, _) in &parsed {
        graph.files.insert(module.clone(), relative.to_string());
    }
    let known: BTreeSet<Module> = graph.files.keys().cloned().collect();
    for (relative, module, ast) in &parsed {
        let mut walker = Walker {
            file: relative,
            file_module: module,
            known: &known,
            scopes: Vec::new(),
            references: Vec::new(),
        };
        walker.walk_items(module.clone(), &ast.items);
        for (target, what) in walker.references {
            graph
                .edges
                .entry((module.clone(), target))
                .or_default()
                .push(what);
        }
    }
    Ok(graph)
}

fn collect_test_module_declarations(module: &Module, items: &[syn::Item], out: &mut Vec<Module>) {
    for item in items {
        if let syn::Item::Mod(m) = item {
            let inner = module.child(&m.ident.to_string());
            if is_test_only(&m.attrs) {
                out.push(inner);
            } else if let Some((_, items)) = &m.content {
                collect_test_module_declarations(&inner, items, out);
            }
        }
    }
}

/// A strongly connected set of modules: every one reaches every other.
#[derive(Debug)]
struct Cycle {
    /// One shortest cycle through the set's first module, closed (first = last).
    path: Vec<Module>,
    /// The edges inside the set, each with what makes it.
    edges: Vec<(Module, Module, Vec<String>)>,
}

/// An import the layout does not allow.
#[derive(Debug)]
struct Violation {
    from: Module,
    to: Module,
    /// The units of the table that forbids the edge: top-level modules, or model parts.
    from_unit: String,
    to_unit: String,
    stage_to_stage: bool,
    evidence: Vec<String>,
}

/// Everything wrong with a graph against a layout table.
#[derive(Debug, Default)]
struct Findings {
    /// Top-level modules (or model parts) missing from the table, with their files.
    unknown: BTreeMap<String, Vec<String>>,
    /// Whether `unknown` and `violations` are of the model's parts ([`MODEL_PARTS`]).
    of_parts: bool,
    cycles: Vec<Cycle>,
    violations: Vec<Violation>,
}

impl Findings {
    fn is_clean(&self) -> bool {
        self.unknown.is_empty() && self.cycles.is_empty() && self.violations.is_empty()
    }
}

impl Graph {
    /// Edges between distinct modules, as adjacency lists.
    fn adjacency(&self) -> BTreeMap<&Module, Vec<&Module>> {
        let mut adjacency: BTreeMap<&Module, Vec<&Module>> =
            self.files.keys().map(|m| (m, Vec::new())).collect();
        for (from, to) in self.edges.keys() {
            if from != to {
                adjacency.entry(from).or_default().push(to);
            }
        }
        adjacency
    }

    /// The strongly connected components of more than one module (Tarjan's algorithm).
    fn cycles(&self) -> Vec<Cycle> {
        let adjacency = self.adjacency();
        let nodes: Vec<&Module> = adjacency.keys().copied().collect();
        let index_of: BTreeMap<&Module, usize> =
            nodes.iter().enumerate().map(|(i, m)| (*m, i)).collect();
        let successors: Vec<Vec<usize>> = nodes
            .iter()
            .map(|m| {
                adjacency[m]
                    .iter()
                    .filter_map(|t| index_of.get(t).copied())
                    .collect()
            })
            .collect();
        strongly_connected(&successors)
            .into_iter()
            .filter(|component| component.len() > 1)
            .map(|component| {
                let members: BTreeSet<usize> = component.iter().copied().collect();
                let start = *members.first().expect("non-empty component");
                let path = shortest_cycle(&successors, &members, start)
                    .into_iter()
                    .map(|i| nodes[i].clone())
                    .collect();
                let edges = self
                    .edges
                    .iter()
                    .filter(|((from, to), _)| {
                        from != to
                            && members.contains(&index_of[from])
                            && index_of.get(to).is_some_and(|t| members.contains(t))
                    })
                    .map(|((from, to), what)| (from.clone(), to.clone(), what.clone()))
                    .collect();
                Cycle { path, edges }
            })
            .collect()
    }

    /// Checks the graph against a layout table (see [`LAYERS`]).
    fn check(&self, layers: &[(&str, &[&str])], stages: &[&str]) -> Findings {
        let allowed: BTreeMap<&str, &[&str]> = layers.iter().copied().collect();
        let mut findings = Findings {
            cycles: self.cycles(),
            ..Findings::default()
        };
        for (module, file) in &self.files {
            let top = module.top();
            if top != "crate" && !allowed.contains_key(top) {
                findings
                    .unknown
                    .entry(top.to_string())
                    .or_default()
                    .push(file.clone());
            }
        }
        for ((from, to), evidence) in &self.edges {
            let (top_from, top_to) = (from.top(), to.top());
            // The library's root only declares modules; an unknown module is reported above.
            if top_from == top_to || top_from == "crate" || !allowed.contains_key(top_from) {
                continue;
            }
            let may = allowed[top_from];
            if may.contains(&ANY) || may.contains(&top_to) {
                continue;
            }
            findings.violations.push(Violation {
                from: from.clone(),
                to: to.clone(),
                from_unit: top_from.to_string(),
                to_unit: top_to.to_string(),
                stage_to_stage: stages.contains(&top_from) && stages.contains(&top_to),
                evidence: evidence.clone(),
            });
        }
        findings
    }

    /// Checks the imports between the parts of top-level module `top` against `parts` (see
    /// [`MODEL_PARTS`]). `top`'s own file may refer to its parts; no part may refer to it.
    fn check_parts(&self, top: &str, parts: &[(&str, &[&str])]) -> Findings {
        let allowed: BTreeMap<&str, &[&str]> = parts.iter().copied().collect();
        let mut findings = Findings {
            of_parts: true,
            ..Findings::default()
        };
        for (module, file) in &self.files {
            if let Some(part) = module.part_of(top) {
                if !allowed.contains_key(part) {
                    findings
                        .unknown
                        .entry(part.to_string())
                        .or_default()
                        .push(file.clone());
                }
            }
        }
        let own_file = Module(vec![top.to_string()]);
        for ((from, to), evidence) in &self.edges {
            let Some(from_part) = from.part_of(top) else {
                continue;
            };
            let to_part = match to.part_of(top) {
                Some(part) => part,
                None if *to == own_file => "mod.rs",
                None => continue,
            };
            if from_part == to_part || !allowed.contains_key(from_part) {
                continue;
            }
            if allowed[from_part].contains(&to_part) {
                continue;
            }
            findings.violations.push(Violation {
                from: from.clone(),
                to: to.clone(),
                from_unit: from_part.to_string(),
                to_unit: to_part.to_string(),
                stage_to_stage: false,
                evidence: evidence.clone(),
            });
        }
        findings
    }

    /// Top-level module → the other top-level modules it imports, with reference counts.
    fn top_level_edges(&self) -> BTreeMap<String, BTreeMap<String, usize>> {
        let mut tops: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
        for ((from, to), evidence) in &self.edges {
            if from.top() != to.top() {
                *tops
                    .entry(from.top().to_string())
                    .or_default()
                    .entry(to.top().to_string())
                    .or_default() += evidence.len();
            }
        }
        tops
    }
}

/// Tarjan's strongly connected components over `successors` (iterative, so that deep
/// graphs cannot overflow the stack).
fn strongly_connected(successors: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let n = successors.len();
    let mut index = vec![usize::MAX; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut components = Vec::new();
    let mut next = 0;
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        // (node, next successor to look at)
        let mut work = vec![(root, 0)];
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(top) = work.last_mut() {
            let v = top.0;
            if let Some(&w) = successors[v].get(top.1) {
                top.1 += 1;
                if index[w] == usize::MAX {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

/// A shortest closed walk start → … → start inside `members` (breadth-first).
fn shortest_cycle(
    successors: &[Vec<usize>],
    members: &BTreeSet<usize>,
    start: usize,
) -> Vec<usize> {
    let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in &successors[v] {
            if !members.contains(&w) {
                continue;
            }
            if w == start {
                let mut path = vec![start, v];
                let mut at = v;
                while at != start {
                    at = came_from[&at];
                    path.push(at);
                }
                path.reverse();
                return path;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = came_from.entry(w) {
                e.insert(v);
                queue.push_back(w);
            }
        }
    }
    unreachable!("a strongly connected component of two or more modules has a cycle")
}

/// At most this many references are quoted per edge.
const EVIDENCE_SHOWN: usize = 3;

fn quote(evidence: &[String]) -> String {
    let shown: Vec<&str> = evidence
        .iter()
        .take(EVIDENCE_SHOWN)
        .map(String::as_str)
        .collect();
    let more = evidence.len().saturating_sub(EVIDENCE_SHOWN);
    let tail = if more > 0 {
        format!("; and {more} more")
    } else {
        String::new()
    };
    format!("{}{tail}", shown.join("; "))
}

impl fmt::Display for Findings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (top, files) in &self.unknown {
            if self.of_parts {
                writeln!(
                    f,
                    "unknown model part `{top}` (src/{}): add it to MODEL_PARTS in \
                     tests/architecture.rs with the parts it may import",
                    files.join(", src/")
                )?;
                continue;
            }
            writeln!(
                f,
                "unknown top-level module `{top}` (src/{}): add it to LAYERS in tests/architecture.rs \
                 with the top-level modules it may import",
                files.join(", src/")
            )?;
        }
        for cycle in &self.cycles {
            let path: Vec<String> = cycle.path.iter().map(ToString::to_string).collect();
            writeln!(f, "import cycle: {}", path.join(" → "))?;
            for (from, to, evidence) in &cycle.edges {
                writeln!(f, "    {from} → {to}: {}", quote(evidence))?;
            }
        }
        for v in &self.violations {
            let kind = if v.stage_to_stage {
                "stage imports another stage"
            } else if self.of_parts {
                "model parts violation"
            } else {
                "layering violation"
            };
            writeln!(
                f,
                "{kind}: {} → {} ({} may not import {}): {}",
                v.from,
                v.to,
                v.from_unit,
                v.to_unit,
                quote(&v.evidence)
            )?;
        }
        Ok(())
    }
}

/// Every `.rs` file under `dir`, as (path relative to `root`, source), sorted by path.
fn read_sources(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            read_sources(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path
                .strip_prefix(root)
                .expect("under src/")
                .to_string_lossy()
                .replace('\\', "/");
            let source = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            out.push((relative, source));
        }
    }
}

fn src_graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    read_sources(&src, &src, &mut files);
    build_graph(&files).unwrap_or_else(|e| panic!("{e}"))
}

fn print_top_level_edges(graph: &Graph) {
    println!("top-level imports of src/ ({} modules):", graph.files.len());
    for (from, targets) in graph.top_level_edges() {
        let list: Vec<String> = targets
            .iter()
            .map(|(to, n)| format!("{to} ({n})"))
            .collect();
        println!("  {from} → {}", list.join(", "));
    }
}

#[test]
fn src_parses_and_every_file_is_a_module() {
    let graph = src_graph();
    print_top_level_edges(&graph);
    assert!(graph.files.contains_key(&Module::root()));
    assert!(graph.files.len() > 10, "found only {:?}", graph.files);
}

#[test]
fn src_has_no_import_cycle_and_respects_the_layers() {
    let graph = src_graph();
    print_top_level_edges(&graph);
    let findings = graph.check(LAYERS, STAGES);
    assert!(findings.is_clean(), "\n{findings}");
}

#[test]
fn the_model_parts_import_only_what_their_table_allows() {
    let graph = src_graph();
    let findings = graph.check_parts(MODEL, MODEL_PARTS);
    assert!(findings.is_clean(), "\n{findings}");
}

#[test]
fn the_model_parts_table_names_only_its_own_parts_and_has_no_cycle() {
    let keys: BTreeSet<&str> = MODEL_PARTS.iter().map(|(part, _)| *part).collect();
    assert_eq!(
        keys.len(),
        MODEL_PARTS.len(),
        "a part is listed twice in MODEL_PARTS"
    );
    for (part, may) in MODEL_PARTS {
        for target in *may {
            assert!(
                keys.contains(target),
                "MODEL_PARTS lets `{part}` import `{target}`, which is not in the table"
            );
        }
    }
    // Each part may import only parts listed before it: the table is its own topological
    // order, so the parts form a directed acyclic graph.
    for (i, (part, may)) in MODEL_PARTS.iter().enumerate() {
        for target in *may {
            let j = MODEL_PARTS.iter().position(|(p, _)| p == target).unwrap();
            assert!(
                j < i,
                "MODEL_PARTS lets `{part}` import `{target}`, listed after it: list the parts \
                 so that each imports only parts above it"
            );
        }
    }
    let parts_found: BTreeSet<String> = src_graph()
        .files
        .keys()
        .filter_map(|m| m.part_of(MODEL).map(str::to_string))
        .collect();
    for part in keys {
        assert!(
            parts_found.contains(part),
            "MODEL_PARTS names `{part}`, which src/model/ does not have"
        );
    }
}

#[test]
fn the_table_keeps_stages_apart_and_names_only_its_own_modules() {
    let keys: BTreeSet<&str> = LAYERS.iter().map(|(top, _)| *top).collect();
    assert_eq!(
        keys.len(),
        LAYERS.len(),
        "a module is listed twice in LAYERS"
    );
    for stage in STAGES {
        assert!(keys.contains(stage), "stage `{stage}` is not in LAYERS");
    }
    for (top, may) in LAYERS {
        for target in *may {
            assert!(
                *target == ANY || keys.contains(target),
                "LAYERS lets `{top}` import `{target}`, which is not in the table"
            );
            assert!(
                !(STAGES.contains(top) && (STAGES.contains(target) || *target == ANY)),
                "LAYERS lets stage `{top}` import `{target}`: stages never import each other"
            );
        }
    }
}

/// In-memory crate trees for the graph code itself.
mod synthetic {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(p, s)| (p.to_string(), s.to_string()))
            .collect()
    }

    fn module(path: &str) -> Module {
        Module(
            path.split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
        )
    }

    fn has_edge(graph: &Graph, from: &str, to: &str) -> bool {
        graph.edges.contains_key(&(module(from), module(to)))
    }

    const TABLE: &[(&str, &[&str])] = &[
        ("main", &["cli"]),
        ("cli", &[ANY]),
        ("svd", &["store", "model", "linalg"]),
        ("train", &["store", "model"]),
        ("model", &["linalg"]),
        ("store", &["model"]),
        ("linalg", &[]),
    ];
    const TABLE_STAGES: &[&str] = &["svd", "train"];

    fn clean_tree() -> Vec<(String, String)> {
        files(&[
            (
                "lib.rs",
                "pub mod cli; pub mod linalg; pub mod model; pub mod store; pub mod svd;",
            ),
            ("main.rs", "fn main() { fsgp::cli::run(); }"),
            ("cli.rs", "use crate::svd; pub fn run() { svd::run(); }"),
            ("linalg.rs", "pub fn chol() {}"),
            (
                "model/mod.rs",
                "pub mod kernel; use crate::linalg::chol; pub use kernel::Kernel; \
                 pub fn fit() { chol() }",
            ),
            (
                "model/kernel.rs",
                "use super::super::linalg; pub struct Kernel; fn f() { linalg::chol(); }",
            ),
            (
                "store.rs",
                "use crate::model::Kernel; pub fn save(_: &Kernel) {}",
            ),
            (
                "svd/mod.rs",
                "mod rsvd; use crate::{store, model::kernel}; \
                 pub fn run() { store::save(&kernel::Kernel); rsvd::go(); } \
                 #[cfg(test)] mod tests { use crate::cli::run; }",
            ),
            (
                "svd/rsvd.rs",
                "pub fn go() { let v = vec![crate::linalg::chol()]; \
                 println!(\"{:?}\", super::super::model::fit()); }",
            ),
            ("svd/tests.rs", "use crate::cli;"),
        ])
    }

    #[test]
    fn a_clean_tree_passes_and_every_kind_of_reference_is_an_edge() {
        let graph = build_graph(&clean_tree()).unwrap();
        let findings = graph.check(TABLE, TABLE_STAGES);
        assert!(findings.is_clean(), "\n{findings}");
        // use crate::a::b, an alias used in code, a child module in code, a macro argument,
        // super::super in a use and in a macro, the binary through the library's name.
        for (from, to) in [
            ("cli", "svd"),
            ("svd", "store"),
            ("svd", "model::kernel"),
            ("svd", "svd::rsvd"),
            ("svd::rsvd", "linalg"),
            ("svd::rsvd", "model"),
            ("model", "linalg"),
            ("model", "model::kernel"),
            ("model::kernel", "linalg"),
            ("main", "cli"),
        ] {
            assert!(
                has_edge(&graph, from, to),
                "missing edge {from} → {to}: {:?}",
                graph.edges.keys()
            );
        }
        // The #[cfg(test)] module's import of cli is not an edge.
        assert!(!has_edge(&graph, "svd", "cli"));
    }

    #[test]
    fn cycles_are_found_with_their_files() {
        let tree = files(&[
            ("lib.rs", "pub mod a; pub mod b; pub mod m;"),
            ("a.rs", "use crate::b::B; pub struct A;"),
            ("b.rs", "pub struct B; fn f() { let _ = crate::a::A; }"),
            ("m/mod.rs", "mod child; use child::X; pub struct Y;"),
            ("m/child.rs", "use super::Y; pub struct X;"),
        ]);
        let graph = build_graph(&tree).unwrap();
        let cycles = graph.cycles();
        assert_eq!(cycles.len(), 2, "{cycles:?}");
        const OPEN: &[(&str, &[&str])] = &[("a", &["b"]), ("b", &["a"]), ("m", &[])];
        let text = graph.check(OPEN, &[]).to_string();
        assert!(
            text.contains("import cycle: crate::a → crate::b → crate::a"),
            "{text}"
        );
        assert!(text.contains("a.rs: use crate::b::B"), "{text}");
        assert!(text.contains("b.rs: crate::a::A"), "{text}");
        assert!(
            text.contains("crate::m → crate::m::child → crate::m"),
            "{text}"
        );
        assert!(text.contains("m/child.rs: use super::Y"), "{text}");
    }

    #[test]
    fn layering_violations_and_unknown_modules_are_reported() {
        let mut tree = clean_tree();
        for (path, source) in &mut tree {
            match path.as_str() {
                // A stage importing another stage, and a layer importing one not below it.
                "svd/mod.rs" => source.push_str(" fn more() { crate::train::rank() }"),
                "store.rs" => source.push_str(" fn chol() { crate::linalg::chol() }"),
                _ => {}
            }
        }
        tree.extend(files(&[
            ("train.rs", "pub fn rank() {}"),
            ("runner.rs", "pub fn go() {}"),
        ]));
        let graph = build_graph(&tree).unwrap();
        let findings = graph.check(TABLE, TABLE_STAGES);
        let text = findings.to_string();
        assert!(
            text.contains("stage imports another stage: crate::svd → crate::train (svd may not import train): svd/mod.rs: crate::train::rank"),
            "{text}"
        );
        assert!(
            text.contains("layering violation: crate::store → crate::linalg"),
            "{text}"
        );
        assert!(
            text.contains("unknown top-level module `runner` (src/runner.rs): add it to LAYERS"),
            "{text}"
        );
        assert_eq!(findings.violations.len(), 2, "{text}");
        assert!(findings.cycles.is_empty(), "{text}");
    }

    #[test]
    fn model_parts_are_checked_against_their_table() {
        const PARTS: &[(&str, &[&str])] = &[("kernel", &[]), ("bound", &["kernel"])];
        let tree = files(&[
            ("lib.rs", "pub mod model;"),
            (
                "model/mod.rs",
                "pub mod bound; pub mod kernel; pub mod extra;",
            ),
            ("model/kernel/mod.rs", "pub mod ard; pub struct K;"),
            (
                "model/kernel/ard.rs",
                "use super::K; use crate::model::bound::objective::f;",
            ),
            ("model/bound/mod.rs", "pub mod objective;"),
            (
                "model/bound/objective.rs",
                "use crate::model::kernel::ard; pub fn f() {}",
            ),
            ("model/extra.rs", "use super::kernel::K;"),
        ]);
        let graph = build_graph(&tree).unwrap();
        let findings = graph.check_parts("model", PARTS);
        let text = findings.to_string();
        assert!(
            text.contains(
                "model parts violation: crate::model::kernel::ard → crate::model::bound::objective \
                 (kernel may not import bound): model/kernel/ard.rs: use crate::model::bound::objective::f"
            ),
            "{text}"
        );
        assert!(
            text.contains("unknown model part `extra` (src/model/extra.rs): add it to MODEL_PARTS"),
            "{text}"
        );
        // bound → kernel is allowed, kernel's files among themselves too.
        assert_eq!(findings.violations.len(), 1, "{text}");
    }

    #[test]
    fn macro_tokens_yield_paths() {
        let tokens: TokenStream = "\"{}\", crate::a::f(x), super::b, y, c::d::E { z: ::std::x }"
            .parse()
            .unwrap();
        let mut paths = Vec::new();
        paths_in_tokens(tokens, &mut paths);
        let joined: Vec<String> = paths.iter().map(|p| p.join("::")).collect();
        assert_eq!(joined, ["crate::a::f", "super::b", "c::d::E", "std::x"]);
    }
}
