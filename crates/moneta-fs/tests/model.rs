//! Model-based test of the nvfs directory calls: random sequences of mkdir, create, unlink,
//! rmdir, rename and link in a tiny namespace (names `a`, `b`, `c`, depth at most 3, so calls
//! collide often), each checked against an in-memory model of what Linux answers; then the
//! whole tree, read back through `readdir` in small batches, and the link counts are compared
//! with the model, before and after a remount. Where two errors apply, the model answers the
//! one Linux reports first (see [`Model::link`] and [`Model::rename`]).

mod common;

use std::collections::{BTreeMap, HashMap};

use common::*;
use moneta_fs::layout::{DT_DIR, DT_REG, ROOT_INO};
use moneta_fs::{Cred, DirEntry, Fs};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

/// What a model path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Dir,
    /// A regular file: hard links share the identity.
    File(u32),
}

/// A call; `P` is a concrete path (`String`) or a generated [`Target`].
#[derive(Clone, Debug)]
enum Op<P = String> {
    Mkdir(P),
    Create(P),
    Unlink(P),
    Rmdir(P),
    Rename(P, P, bool),
    Link(P, P),
}

/// A generated path argument: `path`, or (when `existing` and the model is not empty) a
/// path the model holds, so that calls find their source often enough to succeed.
#[derive(Clone, Debug)]
struct Target {
    path: String,
    existing: Option<Index>,
}

/// The directory containing `p` ("" for the root).
fn parent_of(p: &str) -> &str {
    &p[..p.rfind('/').expect("an absolute path")]
}

/// Whether `p` is `anc` or lies below it.
fn within(p: &str, anc: &str) -> bool {
    p == anc || (p.starts_with(anc) && p.as_bytes()[anc.len()] == b'/')
}

/// The model: absolute path ("/a/b") to what it names; the root ("") is implicit.
#[derive(Debug, Default)]
struct Model {
    entries: BTreeMap<String, Kind>,
    next_id: u32,
}

type Expect = Result<(), i32>;

impl Model {
    fn get(&self, p: &str) -> Option<Kind> {
        self.entries.get(p).copied()
    }

    /// Resolution of the directories leading to the last component of `p`, in order: a
    /// missing one is `ENOENT`, a file is `ENOTDIR`.
    fn walk_parent(&self, p: &str) -> Expect {
        for (i, _) in p.match_indices('/').skip(1) {
            match self.get(&p[..i]) {
                None => return Err(libc::ENOENT),
                Some(Kind::File(_)) => return Err(libc::ENOTDIR),
                Some(Kind::Dir) => {}
            }
        }
        Ok(())
    }

    fn children<'a>(&'a self, dir: &'a str) -> impl Iterator<Item = (&'a String, Kind)> + 'a {
        self.entries
            .iter()
            .filter(move |(p, _)| parent_of(p) == dir)
            .map(|(p, k)| (p, *k))
    }

    fn subdirs(&self, dir: &str) -> usize {
        self.children(dir).filter(|(_, k)| *k == Kind::Dir).count()
    }

    fn links(&self, id: u32) -> usize {
        self.entries
            .values()
            .filter(|k| **k == Kind::File(id))
            .count()
    }

    fn new_file(&mut self) -> Kind {
        self.next_id += 1;
        Kind::File(self.next_id)
    }

    fn mkdir(&mut self, p: &str) -> Expect {
        self.walk_parent(p)?;
        if self.get(p).is_some() {
            return Err(libc::EEXIST);
        }
        self.entries.insert(p.to_owned(), Kind::Dir);
        Ok(())
    }

    /// `open(O_CREAT | O_EXCL | O_RDWR)`.
    fn create(&mut self, p: &str) -> Expect {
        self.walk_parent(p)?;
        if self.get(p).is_some() {
            return Err(libc::EEXIST);
        }
        let k = self.new_file();
        self.entries.insert(p.to_owned(), k);
        Ok(())
    }

    fn unlink(&mut self, p: &str) -> Expect {
        self.walk_parent(p)?;
        match self.get(p) {
            None => Err(libc::ENOENT),
            Some(Kind::Dir) => Err(libc::EISDIR),
            Some(Kind::File(_)) => {
                self.entries.remove(p);
                Ok(())
            }
        }
    }

    fn rmdir(&mut self, p: &str) -> Expect {
        self.walk_parent(p)?;
        match self.get(p) {
            None => Err(libc::ENOENT),
            Some(Kind::File(_)) => Err(libc::ENOTDIR),
            Some(Kind::Dir) if self.children(p).next().is_some() => Err(libc::ENOTEMPTY),
            Some(Kind::Dir) => {
                self.entries.remove(p);
                Ok(())
            }
        }
    }

    /// `link(2)`. As Linux: `EEXIST` before `EPERM` when `from` is a directory and `to` exists
    /// (the new name is looked up before the source is examined).
    fn link(&mut self, from: &str, to: &str) -> Expect {
        self.walk_parent(from)?;
        let src = self.get(from).ok_or(libc::ENOENT)?;
        self.walk_parent(to)?;
        if self.get(to).is_some() {
            return Err(libc::EEXIST);
        }
        if src == Kind::Dir {
            return Err(libc::EPERM);
        }
        self.entries.insert(to.to_owned(), src);
        Ok(())
    }

    /// `rename(2)`, or `renameat2(RENAME_NOREPLACE)`. As Linux: `EINVAL` when `from` is a
    /// directory and an ancestor of `to`, then `ENOTEMPTY` when `to` is an ancestor of `from`
    /// (the lock_rename trap), before the types are compared.
    fn rename(&mut self, from: &str, to: &str, noreplace: bool) -> Expect {
        self.walk_parent(from)?;
        self.walk_parent(to)?;
        let src = self.get(from).ok_or(libc::ENOENT)?;
        let dst = self.get(to);
        if noreplace && dst.is_some() {
            return Err(libc::EEXIST);
        }
        if from == to || (dst == Some(src) && src != Kind::Dir) {
            // The same file under both names: nothing happens.
            return Ok(());
        }
        if src == Kind::Dir && within(parent_of(to), from) {
            return Err(libc::EINVAL);
        }
        if dst.is_some() && within(from, to) {
            return Err(libc::ENOTEMPTY);
        }
        match (src, dst) {
            (Kind::Dir, Some(Kind::File(_))) => return Err(libc::ENOTDIR),
            (Kind::File(_), Some(Kind::Dir)) => return Err(libc::EISDIR),
            (_, Some(Kind::Dir)) if self.children(to).next().is_some() => {
                return Err(libc::ENOTEMPTY)
            }
            _ => {}
        }
        self.entries.remove(to);
        let moved: Vec<String> = self
            .entries
            .keys()
            .filter(|p| within(p, from))
            .cloned()
            .collect();
        for p in moved {
            let k = self.entries.remove(&p).expect("listed");
            self.entries.insert(format!("{to}{}", &p[from.len()..]), k);
        }
        Ok(())
    }

    fn pick(&self, t: &Target) -> String {
        match t.existing {
            Some(i) if !self.entries.is_empty() => {
                let n = i.index(self.entries.len());
                self.entries.keys().nth(n).expect("in range").clone()
            }
            _ => t.path.clone(),
        }
    }

    /// `op` with its path arguments made concrete against the current state.
    fn concrete(&self, op: &Op<Target>) -> Op {
        match op {
            Op::Mkdir(p) => Op::Mkdir(self.pick(p)),
            Op::Create(p) => Op::Create(self.pick(p)),
            Op::Unlink(p) => Op::Unlink(self.pick(p)),
            Op::Rmdir(p) => Op::Rmdir(self.pick(p)),
            Op::Rename(f, t, nr) => Op::Rename(self.pick(f), self.pick(t), *nr),
            Op::Link(f, t) => Op::Link(self.pick(f), self.pick(t)),
        }
    }

    fn apply(&mut self, op: &Op) -> Expect {
        match op {
            Op::Mkdir(p) => self.mkdir(p),
            Op::Create(p) => self.create(p),
            Op::Unlink(p) => self.unlink(p),
            Op::Rmdir(p) => self.rmdir(p),
            Op::Rename(f, t, nr) => self.rename(f, t, *nr),
            Op::Link(f, t) => self.link(f, t),
        }
    }
}

/// Runs `op` on the file system as root: `Ok` or the errno.
fn run(fs: &mut Fs, op: &Op) -> Expect {
    let root = Cred::root();
    let r = match op {
        Op::Mkdir(p) => fs.mkdir(&root, p.as_bytes(), 0o755).map(drop),
        Op::Create(p) => fs
            .open(
                &root,
                p.as_bytes(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o644,
            )
            .and_then(|o| {
                assert!(o.created, "{op:?} succeeded without creating");
                fs.close(o.ino)
            }),
        Op::Unlink(p) => fs.unlink(&root, p.as_bytes()),
        Op::Rmdir(p) => fs.rmdir(&root, p.as_bytes()),
        Op::Rename(f, t, nr) => fs.rename(&root, f.as_bytes(), t.as_bytes(), *nr),
        Op::Link(f, t) => fs.link(&root, f.as_bytes(), t.as_bytes()).map(drop),
    };
    r.map_err(|e| e.errno)
}

fn fail(msg: String) -> TestCaseError {
    TestCaseError::fail(msg)
}

/// Every entry of directory `ino`, read with a cookie loop `batch` entries at a time.
fn read_all(fs: &Fs, ino: u64, batch: usize) -> Result<Vec<DirEntry>, TestCaseError> {
    let mut out = Vec::new();
    let mut cookie = 0;
    for _ in 0..1000 {
        let (entries, end) = fs
            .readdir(ino, cookie, batch)
            .map_err(|e| fail(format!("readdir({ino}, {cookie}, {batch}): {e}")))?;
        prop_assert!(entries.len() <= batch, "more than {batch} entries");
        if let Some(last) = entries.last() {
            cookie = last.next;
        } else {
            prop_assert!(end, "readdir returned nothing before the end");
        }
        out.extend(entries);
        if end {
            return Ok(out);
        }
    }
    Err(fail(format!("readdir of inode {ino} never ends")))
}

/// Walks the whole tree through `readdir` and compares it, and the link counts, with `model`.
fn check_tree(fs: &Fs, model: &Model, batch: usize) -> Result<(), TestCaseError> {
    let root = Cred::root();
    // Path (as in the model) -> (DT_* kind, inode), from readdir.
    let mut found: BTreeMap<String, (u8, u64)> = BTreeMap::new();
    let mut stack = vec![(String::new(), ROOT_INO, ROOT_INO)];
    while let Some((dir, ino, parent)) = stack.pop() {
        let shown = if dir.is_empty() { "/" } else { dir.as_str() };
        prop_assert_eq!(
            fs.lookup(&root, shown.as_bytes(), true),
            Ok(ino),
            "lookup of {}",
            shown
        );
        let entries = read_all(fs, ino, batch)?;
        let mut names: Vec<&[u8]> = entries.iter().map(|e| &e.name[..]).collect();
        names.sort();
        names.dedup();
        prop_assert_eq!(names.len(), entries.len(), "duplicate names in {}", shown);
        let dot = entries.iter().find(|e| e.name == b".");
        let dotdot = entries.iter().find(|e| e.name == b"..");
        prop_assert_eq!(
            dot.map(|e| (e.ino, e.kind)),
            Some((ino, DT_DIR)),
            "`.` of {} in {:?}",
            shown,
            entries
        );
        prop_assert_eq!(
            dotdot.map(|e| (e.ino, e.kind)),
            Some((parent, DT_DIR)),
            "`..` of {} in {:?}",
            shown,
            entries
        );
        for e in entries.iter().filter(|e| e.name != b"." && e.name != b"..") {
            let path = format!("{dir}/{}", String::from_utf8_lossy(&e.name));
            if e.kind == DT_DIR {
                stack.push((path.clone(), e.ino, ino));
            }
            found.insert(path, (e.kind, e.ino));
        }
    }
    let want: BTreeMap<&str, u8> = model
        .entries
        .iter()
        .map(|(p, k)| (p.as_str(), if *k == Kind::Dir { DT_DIR } else { DT_REG }))
        .collect();
    let got: BTreeMap<&str, u8> = found.iter().map(|(p, (k, _))| (p.as_str(), *k)).collect();
    prop_assert_eq!(got, want, "the tree differs from the model");
    // Hard links share an inode, different files do not.
    let mut ino_of: HashMap<u32, u64> = HashMap::new();
    let mut id_of: HashMap<u64, Kind> = HashMap::new();
    for (p, k) in &model.entries {
        let ino = found[p].1;
        prop_assert_eq!(
            *id_of.entry(ino).or_insert(*k),
            *k,
            "{} shares inode {} with another file",
            p,
            ino
        );
        if let Kind::File(id) = *k {
            prop_assert_eq!(
                *ino_of.entry(id).or_insert(ino),
                ino,
                "links of one file differ: {}",
                p
            );
        }
    }
    // Link counts.
    let st = fs
        .stat(&root, b"/", false)
        .map_err(|e| fail(format!("stat /: {e}")))?;
    prop_assert_eq!(st.nlink as usize, 2 + model.subdirs(""), "nlink of /");
    for (p, k) in &model.entries {
        let st = fs
            .stat(&root, p.as_bytes(), false)
            .map_err(|e| fail(format!("stat {p}: {e}")))?;
        prop_assert_eq!(st.ino, found[p].1, "stat and readdir disagree on {}", p);
        let want = match *k {
            Kind::Dir => 2 + model.subdirs(p),
            Kind::File(id) => model.links(id),
        };
        prop_assert_eq!(st.nlink as usize, want, "nlink of {}", p);
    }
    Ok(())
}

fn path() -> impl Strategy<Value = String> {
    // Shallow paths more often, so that calls find what they name.
    let depth = prop_oneof![3 => Just(1usize), 3 => Just(2usize), 2 => Just(3usize)];
    depth
        .prop_flat_map(|d| prop::collection::vec(prop::sample::select(&["a", "b", "c"][..]), d))
        .prop_map(|v| format!("/{}", v.join("/")))
}

/// A path as given.
fn lit() -> impl Strategy<Value = Target> {
    path().prop_map(|path| Target {
        path,
        existing: None,
    })
}

/// A path as given, or with probability `p` one that exists.
fn target(p: f64) -> impl Strategy<Value = Target> {
    (path(), prop::option::weighted(p, any::<Index>()))
        .prop_map(|(path, existing)| Target { path, existing })
}

fn op() -> impl Strategy<Value = Op<Target>> {
    prop_oneof![
        3 => lit().prop_map(Op::Mkdir),
        3 => lit().prop_map(Op::Create),
        1 => target(0.5).prop_map(Op::Unlink),
        1 => target(0.5).prop_map(Op::Rmdir),
        3 => (target(0.7), target(0.25), prop::bool::weighted(0.25))
            .prop_map(|(f, t, nr)| Op::Rename(f, t, nr)),
        2 => (target(0.7), target(0.1)).prop_map(|(f, t)| Op::Link(f, t)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        // No regression file next to the sources.
        failure_persistence: None,
        ..ProptestConfig::with_cases(64)
    })]

    #[test]
    fn directory_calls_match_the_model(
        ops in prop::collection::vec(op(), 1..60),
        // Entries asked of each `readdir` call. With 1, nvfs (at this writing) answers an empty
        // directory's first call with `.` alone and `end = true`, losing `..`: a bug this
        // test reports (Linux would hand `..` out on the next call).
        batch in 1usize..=4,
    ) {
        let a = formatted(16 << 20);
        let mut model = Model::default();
        // mkfs makes /lost+found.
        model.entries.insert("/lost+found".into(), Kind::Dir);
        {
            let mut fs = mount(&a);
            let mut done = Vec::new();
            for op in &ops {
                let op = model.concrete(op);
                let want = model.apply(&op);
                let got = run(&mut fs, &op);
                done.push(op);
                prop_assert_eq!(got, want, "the last of {:#?}", done);
            }
            check_tree(&fs, &model, batch)?;
            let report = fs.check();
            prop_assert_eq!(report.errors(), 0, "{:?}", report.problems);
        }
        let fs = mount(&a);
        check_tree(&fs, &model, batch)?;
        let report = fs.check();
        prop_assert_eq!(report.errors(), 0, "{:?}", report.problems);
    }
}
