//! No two modules of the crate import each other, nor import each other
//! through others (a cycle). Reads the sources, not the compiler's view:
//! from each crate root (`src/lib.rs`, `src/main.rs`, `src/bin/*`, and the
//! same under `crates/*/`), the module tree follows `mod` items (`#[path]`
//! honoured; `#[cfg(test)]` modules left out: tests may use anything), and
//! a module imports a crate module when it names it: `use crate::x::...`,
//! a `crate::x::` path in code, `super::` and `self::` resolved, or a path
//! that starts with the name of one of its own child modules. Comments and
//! string literals are skipped.
//!
//! What "each other" means: for two modules neither of which contains the
//! other (a parent naturally declares its children and a child uses its
//! parent), `a` imports `b` when any module inside `a` (itself included)
//! names `b` or a module inside it. So `files` → `seccomp` and
//! `seccomp::filters` → `files` make `files` and `seccomp` import each
//! other. Among the children of each module the imports must form no cycle
//! (pairs are named as pairs, longer cycles as cycles).
//!
//! Run `cargo test --test module_cycles -- --nocapture` to see each
//! module's imports as well.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    /// `::`
    Path,
    Punct(char),
}

/// Tokens of `src` with their line numbers, without comments, and with
/// strings, chars and lifetimes reduced to what the scan needs.
fn tokenize(src: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if c[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if ch == '"' || ((ch == 'r' || ch == 'b') && raw_or_byte_string(&c, i)) {
            let start_line = line;
            let (text, next) = string_literal(&c, i, &mut line);
            out.push((Tok::Str(text), start_line));
            i = next;
        } else if ch == '\'' {
            // A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
            if c.get(i + 1) == Some(&'\\') {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if c.get(i + 2) == Some(&'\'') {
                i += 3;
            } else {
                i += 1;
            }
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            // `r#ident`
            if word == "r" && c.get(i) == Some(&'#') {
                i += 1;
                continue;
            }
            out.push((Tok::Ident(word), line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// Whether `c[i..]` starts a raw or byte string (`r"`, `r#"`, `b"`, `br"`,
/// `br#"`), not an identifier.
fn raw_or_byte_string(c: &[char], i: usize) -> bool {
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return false;
    }
    let mut j = i;
    if c[j] == 'b' {
        j += 1;
    }
    if c.get(j) == Some(&'r') {
        j += 1;
        while c.get(j) == Some(&'#') {
            j += 1;
        }
    }
    j > i && c.get(j) == Some(&'"')
}

/// The text of the string literal at `c[i..]` and the index after it.
fn string_literal(c: &[char], mut i: usize, line: &mut usize) -> (String, usize) {
    let mut raw = false;
    if c[i] == 'b' {
        i += 1;
    }
    let mut hashes = 0;
    if c[i] == 'r' {
        raw = true;
        i += 1;
        while c[i] == '#' {
            hashes += 1;
            i += 1;
        }
    }
    i += 1; // the opening quote
    let mut text = String::new();
    while i < c.len() {
        if c[i] == '\n' {
            *line += 1;
        }
        if !raw && c[i] == '\\' {
            text.push(c[i]);
            if let Some(&n) = c.get(i + 1) {
                text.push(n);
                if n == '\n' {
                    *line += 1;
                }
            }
            i += 2;
            continue;
        }
        if c[i] == '"' && (0..hashes).all(|k| c.get(i + 1 + k) == Some(&'#')) {
            return (text, i + 1 + hashes);
        }
        text.push(c[i]);
        i += 1;
    }
    (text, i)
}

/// One module of a crate.
#[derive(Debug)]
struct Module {
    /// `crate::a::b`
    name: String,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    /// The file its items are in.
    file: PathBuf,
    /// Paths it names: (segments, line).
    paths: Vec<(Vec<String>, usize)>,
}

struct Crate {
    modules: Vec<Module>,
    /// What file names are shown relative to.
    repo: PathBuf,
}

impl Crate {
    fn load(root: &Path, repo: &Path) -> Crate {
        let mut krate = Crate {
            repo: repo.to_path_buf(),
            modules: vec![Module {
                name: "crate".into(),
                parent: None,
                children: BTreeMap::new(),
                file: root.to_path_buf(),
                paths: Vec::new(),
            }],
        };
        let dir = root.parent().unwrap().to_path_buf();
        krate.load_file(0, root, &dir);
        krate
    }

    /// Parses `file` as module `id`, whose child modules' files are in
    /// `child_dir`.
    fn load_file(&mut self, id: usize, file: &Path, child_dir: &Path) {
        let src =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let toks = tokenize(&src);
        let file_dir = file.parent().unwrap().to_path_buf();
        self.items(id, &toks, file, &file_dir, child_dir);
    }

    /// Reads the items of module `id` from `toks`: its child modules (files
    /// or inline) and the paths it names.
    fn items(
        &mut self,
        id: usize,
        toks: &[(Tok, usize)],
        file: &Path,
        file_dir: &Path,
        child_dir: &Path,
    ) {
        let mut attrs: Vec<Vec<Tok>> = Vec::new();
        let mut i = 0;
        while i < toks.len() {
            match &toks[i].0 {
                Tok::Punct('#') => {
                    let mut j = i + 1;
                    if toks.get(j).map(|t| &t.0) == Some(&Tok::Punct('!')) {
                        j += 1;
                    }
                    if toks.get(j).map(|t| &t.0) == Some(&Tok::Punct('[')) {
                        let end = matching(toks, j, '[', ']');
                        attrs.push(toks[j + 1..end].iter().map(|t| t.0.clone()).collect());
                        i = end + 1;
                        continue;
                    }
                    attrs.clear();
                    i += 1;
                }
                Tok::Ident(w) if w == "pub" => {
                    i += 1;
                    if toks.get(i).map(|t| &t.0) == Some(&Tok::Punct('(')) {
                        i = matching(toks, i, '(', ')') + 1;
                    }
                }
                Tok::Ident(w) if w == "mod" => {
                    let Some((Tok::Ident(name), _)) = toks.get(i + 1) else {
                        i += 1;
                        continue;
                    };
                    let name = name.clone();
                    let test_only = attrs.iter().any(|a| {
                        a == &[
                            Tok::Ident("cfg".into()),
                            Tok::Punct('('),
                            Tok::Ident("test".into()),
                            Tok::Punct(')'),
                        ]
                    });
                    let path_attr = attrs.iter().find_map(|a| match a.as_slice() {
                        [Tok::Ident(p), Tok::Punct('='), Tok::Str(s)] if p == "path" => {
                            Some(s.clone())
                        }
                        _ => None,
                    });
                    attrs.clear();
                    match toks.get(i + 2).map(|t| &t.0) {
                        Some(Tok::Punct(';')) => {
                            if !test_only {
                                let path = match &path_attr {
                                    Some(p) => file_dir.join(p),
                                    None => {
                                        let flat = child_dir.join(format!("{name}.rs"));
                                        if flat.exists() {
                                            flat
                                        } else {
                                            child_dir.join(&name).join("mod.rs")
                                        }
                                    }
                                };
                                let child = self.add_child(id, &name, &path);
                                let dir = if path.file_name().is_some_and(|f| f == "mod.rs") {
                                    path.parent().unwrap().to_path_buf()
                                } else {
                                    path.parent().unwrap().join(&name)
                                };
                                self.load_file(child, &path, &dir);
                            }
                            i += 3;
                        }
                        Some(Tok::Punct('{')) => {
                            let end = matching(toks, i + 2, '{', '}');
                            if !test_only {
                                let child = self.add_child(id, &name, file);
                                let dir = child_dir.join(&name);
                                self.items(child, &toks[i + 3..end], file, file_dir, &dir);
                            }
                            i = end + 1;
                        }
                        _ => i += 2,
                    }
                }
                Tok::Ident(w) if w == "use" => {
                    attrs.clear();
                    let mut paths = Vec::new();
                    let end = use_tree(toks, i + 1, Vec::new(), &mut paths);
                    let line = toks[i].1;
                    for p in paths {
                        self.modules[id].paths.push((p, line));
                    }
                    i = end;
                }
                Tok::Ident(first) => {
                    attrs.clear();
                    let starts_path = i == 0 || toks[i - 1].0 != Tok::Path;
                    if starts_path && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Path) {
                        let mut segs = vec![first.clone()];
                        let mut j = i + 1;
                        while toks.get(j).map(|t| &t.0) == Some(&Tok::Path) {
                            match toks.get(j + 1) {
                                Some((Tok::Ident(s), _)) => {
                                    segs.push(s.clone());
                                    j += 2;
                                }
                                _ => break,
                            }
                        }
                        self.modules[id].paths.push((segs, toks[i].1));
                        i = j;
                    } else {
                        i += 1;
                    }
                }
                _ => {
                    attrs.clear();
                    i += 1;
                }
            }
        }
    }

    fn add_child(&mut self, parent: usize, name: &str, file: &Path) -> usize {
        let id = self.modules.len();
        let full = format!("{}::{name}", self.modules[parent].name);
        self.modules.push(Module {
            name: full,
            parent: Some(parent),
            children: BTreeMap::new(),
            file: file.to_path_buf(),
            paths: Vec::new(),
        });
        self.modules[parent].children.insert(name.to_string(), id);
        id
    }

    /// The crate module a path named in module `from` leads to, if any.
    fn resolve(&self, from: usize, segs: &[String]) -> Option<usize> {
        let first = segs.first()?;
        let mut cur = match first.as_str() {
            "crate" => 0,
            "super" => self.modules[from].parent?,
            "self" => from,
            name => *self.modules[from].children.get(name)?,
        };
        for s in &segs[1..] {
            cur = match s.as_str() {
                "super" => self.modules[cur].parent?,
                "self" => cur,
                name => match self.modules[cur].children.get(name) {
                    Some(&c) => c,
                    None => break,
                },
            };
        }
        Some(cur)
    }

    /// `id` and its ancestors, root last.
    fn ancestry(&self, mut id: usize) -> Vec<usize> {
        let mut chain = vec![id];
        while let Some(p) = self.modules[id].parent {
            chain.push(p);
            id = p;
        }
        chain
    }
}

/// The index of the token that closes the bracket opened at `open`.
fn matching(toks: &[(Tok, usize)], open: usize, o: char, c: char) -> usize {
    let mut depth = 0;
    for (k, (t, _)) in toks.iter().enumerate().skip(open) {
        if *t == Tok::Punct(o) {
            depth += 1;
        } else if *t == Tok::Punct(c) {
            depth -= 1;
            if depth == 0 {
                return k;
            }
        }
    }
    toks.len() - 1
}

/// Parses a use tree at `toks[i..]` under `prefix`, adding its full paths
/// to `out`; returns the index after it (after the `;` at the top).
fn use_tree(
    toks: &[(Tok, usize)],
    mut i: usize,
    prefix: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut path = prefix;
    loop {
        match toks.get(i).map(|t| &t.0) {
            Some(Tok::Path) => i += 1,
            Some(Tok::Ident(s)) if s == "as" => {
                i += 2;
            }
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                i += 1;
            }
            Some(Tok::Punct('*')) => {
                i += 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i).map(|t| &t.0) {
                        Some(Tok::Punct('}')) => {
                            i += 1;
                            break;
                        }
                        Some(Tok::Punct(',')) => i += 1,
                        None => return i,
                        _ => i = use_tree(toks, i, path.clone(), out),
                    }
                }
                // A group adds its members, not the prefix alone.
                path.clear();
            }
            Some(Tok::Punct(';')) => {
                if !path.is_empty() {
                    out.push(path);
                }
                return i + 1;
            }
            Some(Tok::Punct(',')) | Some(Tok::Punct('}')) | None => {
                if !path.is_empty() {
                    out.push(path);
                }
                return i;
            }
            Some(_) => i += 1,
        }
    }
}

/// The crate roots under the repository.
fn crate_roots(repo: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![repo.to_path_buf()];
    if let Ok(entries) = std::fs::read_dir(repo.join("crates")) {
        let mut members: Vec<PathBuf> = entries.map_while(Result::ok).map(|e| e.path()).collect();
        members.sort();
        dirs.extend(members);
    }
    let mut roots = Vec::new();
    for d in dirs {
        let src = d.join("src");
        for f in ["lib.rs", "main.rs"] {
            if src.join(f).exists() {
                roots.push(src.join(f));
            }
        }
        if let Ok(entries) = std::fs::read_dir(src.join("bin")) {
            let mut bins: Vec<PathBuf> = entries
                .map_while(Result::ok)
                .map(|e| e.path())
                .filter_map(|p| {
                    if p.extension().is_some_and(|e| e == "rs") {
                        Some(p)
                    } else if p.join("main.rs").exists() {
                        Some(p.join("main.rs"))
                    } else {
                        None
                    }
                })
                .collect();
            bins.sort();
            roots.extend(bins);
        }
    }
    roots
}

/// The cycles among sibling modules of `krate`, as lines of text; prints
/// each module's imports.
fn cycles(krate: &Crate, label: &str) -> Vec<String> {
    // Module-level imports, with one example each: (from, to) -> where.
    let mut uses: BTreeMap<(usize, usize), String> = BTreeMap::new();
    for (id, m) in krate.modules.iter().enumerate() {
        for (segs, line) in &m.paths {
            if let Some(to) = krate.resolve(id, segs) {
                if to != id {
                    uses.entry((id, to)).or_insert_with(|| {
                        let file = m.file.strip_prefix(&krate.repo).unwrap_or(&m.file);
                        format!("{}:{line} `{}`", file.display(), segs.join("::"))
                    });
                }
            }
        }
    }
    let mut by_module: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for &(a, b) in uses.keys() {
        by_module
            .entry(&krate.modules[a].name)
            .or_default()
            .insert(&krate.modules[b].name);
    }
    println!("{label}: each module and the crate modules it names:");
    for (m, to) in &by_module {
        println!(
            "  {m} -> {}",
            to.iter().copied().collect::<Vec<_>>().join(", ")
        );
    }
    // Lifted to siblings: under their lowest common ancestor, the child
    // that holds `a` imports the child that holds `b`.
    let mut lifted: BTreeMap<usize, BTreeMap<(usize, usize), Vec<String>>> = BTreeMap::new();
    for (&(a, b), at) in &uses {
        let (up_a, up_b) = (krate.ancestry(a), krate.ancestry(b));
        if up_a.contains(&b) || up_b.contains(&a) {
            continue; // a parent and its descendant
        }
        let common = *up_a.iter().find(|x| up_b.contains(x)).unwrap();
        let ca = up_a[up_a.iter().position(|&x| x == common).unwrap() - 1];
        let cb = up_b[up_b.iter().position(|&x| x == common).unwrap() - 1];
        let why = format!(
            "{} names {} at {at}",
            krate.modules[a].name, krate.modules[b].name
        );
        lifted
            .entry(common)
            .or_default()
            .entry((ca, cb))
            .or_default()
            .push(why);
    }
    let mut found = Vec::new();
    for edges in lifted.values() {
        let nodes: BTreeSet<usize> = edges.keys().flat_map(|&(a, b)| [a, b]).collect();
        let nodes: Vec<usize> = nodes.into_iter().collect();
        let n = nodes.len();
        let idx = |x: usize| nodes.iter().position(|&y| y == x).unwrap();
        let mut reach = vec![vec![false; n]; n];
        for &(a, b) in edges.keys() {
            reach[idx(a)][idx(b)] = true;
        }
        for k in 0..n {
            for i in 0..n {
                for j in 0..n {
                    if reach[i][k] && reach[k][j] {
                        reach[i][j] = true;
                    }
                }
            }
        }
        let name = |i: usize| krate.modules[nodes[i]].name.as_str();
        let mut in_pair = vec![false; n];
        for i in 0..n {
            for j in i + 1..n {
                let (ab, ba) = (
                    edges.get(&(nodes[i], nodes[j])),
                    edges.get(&(nodes[j], nodes[i])),
                );
                if let (Some(ab), Some(ba)) = (ab, ba) {
                    in_pair[i] = true;
                    in_pair[j] = true;
                    found.push(format!(
                        "{label}: {} and {} import each other: {}; {}",
                        name(i),
                        name(j),
                        ab[0],
                        ba[0]
                    ));
                }
            }
        }
        // Cycles of three or more (strongly connected sets not made of
        // pairs alone).
        let mut seen = vec![false; n];
        for i in 0..n {
            if seen[i] || !reach[i][i] {
                continue;
            }
            let set: Vec<usize> = (0..n).filter(|&j| reach[i][j] && reach[j][i]).collect();
            for &j in &set {
                seen[j] = true;
            }
            let pairs_only = set.len() == 2 && set.iter().all(|&j| in_pair[j]);
            if set.len() >= 2 && !pairs_only {
                let mut why = Vec::new();
                for &a in &set {
                    for &b in &set {
                        if let Some(w) = edges.get(&(nodes[a], nodes[b])) {
                            why.push(w[0].clone());
                        }
                    }
                }
                found.push(format!(
                    "{label}: a cycle through {}: {}",
                    set.iter().map(|&j| name(j)).collect::<Vec<_>>().join(", "),
                    why.join("; ")
                ));
            }
        }
    }
    found
}

#[test]
fn no_two_modules_import_each_other() {
    // Another tree can be checked with MODULE_CYCLES_ROOT=DIR (how the
    // cycles this test reports were shown on the code before their fix).
    let repo = std::env::var_os("MODULE_CYCLES_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let repo = repo.as_path();
    let mut found = Vec::new();
    for root in crate_roots(repo) {
        let krate = Crate::load(&root, repo);
        let label = root
            .strip_prefix(repo)
            .unwrap_or(&root)
            .display()
            .to_string();
        found.extend(cycles(&krate, &label));
    }
    assert!(found.is_empty(), "module cycles:\n{}", found.join("\n"));
}

#[test]
fn the_scan_sees_imports_and_skips_comments_strings_and_tests() {
    let toks = tokenize(
        "// crate::a::x\n/* crate::b */ let s = \"crate::c\"; let r = r#\"crate::d\"#;\n\
         let c = '\\''; fn f<'l>() {} use crate::e::{f::g, h as i};",
    );
    let idents: Vec<&str> = toks
        .iter()
        .filter_map(|(t, _)| match t {
            Tok::Ident(s) => Some(s.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        !idents.contains(&"a") && !idents.contains(&"b"),
        "{idents:?}"
    );
    assert!(toks.contains(&(Tok::Str("crate::c".into()), 2)), "{toks:?}");
    assert!(toks.contains(&(Tok::Str("crate::d".into()), 2)), "{toks:?}");
    let at = toks
        .iter()
        .position(|(t, _)| *t == Tok::Ident("use".into()))
        .unwrap();
    let mut paths = Vec::new();
    use_tree(&toks, at + 1, Vec::new(), &mut paths);
    assert_eq!(
        paths,
        vec![
            vec!["crate".to_string(), "e".into(), "f".into(), "g".into()],
            vec!["crate".to_string(), "e".into(), "h".into()],
        ]
    );
    // A pair is found: two modules of a made-up crate naming each other.
    let dir = std::env::temp_dir().join(format!("teravm-cycles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("b")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\n#[cfg(test)]\nmod t;\n").unwrap();
    std::fs::write(dir.join("a.rs"), "use crate::b::inner::X;\n").unwrap();
    std::fs::write(dir.join("b/mod.rs"), "mod inner;\n").unwrap();
    std::fs::write(dir.join("b/inner.rs"), "fn f() { super::super::a::g() }\n").unwrap();
    let krate = Crate::load(&dir.join("lib.rs"), &dir);
    let found = cycles(&krate, "made-up");
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("crate::a and crate::b import each other"),
        "{found:?}"
    );
    // Without the way back, none.
    std::fs::write(dir.join("b/inner.rs"), "fn f() {}\n").unwrap();
    assert!(cycles(&Crate::load(&dir.join("lib.rs"), &dir), "made-up").is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}
