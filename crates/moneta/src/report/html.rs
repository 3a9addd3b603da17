//! The page of `moneta report`: one self-contained HTML file.
//!
//! This file owns the page model ([`Page`], [`Section`], [`Table`]) and its writer. The page
//! has inline CSS and nothing else: no scripts, no fonts or style sheets from elsewhere, so it
//! opens the same from a laptop's disk, an archive or a mail attachment. Figures are PNG files
//! beside it and data files are linked by relative name, so the directory can be moved whole.
//! Every text the caller gives is plain text and is escaped here.

use std::fmt::Write as _;
use std::path::Path;

/// A report page: a header, the machine it was measured on, then one section per figure.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Page {
    /// Page title, shown in the header and the browser tab.
    pub title: String,
    /// When the report was made, as it should be shown (e.g. `"2026-11-23 08:54 UTC"`).
    pub generated: String,
    /// Rows describing the machine: CPU, cores, memory, kernel, ...
    pub machine: Vec<(String, String)>,
    /// Rows of software versions: moneta, rustc, kernel, ...
    pub versions: Vec<(String, String)>,
    /// Opening text; a blank line starts a new paragraph.
    pub intro: String,
    /// The figures, in page order.
    pub sections: Vec<Section>,
}

/// One figure of the report, with what it says and how to make it again.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Section {
    /// Anchor of the section (`report.html#id`); characters other than ASCII letters, digits,
    /// `-` and `_` are replaced by `-`.
    pub id: String,
    /// Heading.
    pub title: String,
    /// One line: what the figure says. Shown in bold under the heading.
    pub reading: String,
    /// What the paper's corresponding figure showed, for comparison.
    pub paper: Option<String>,
    /// File names of the figures, relative to the page, in order.
    pub images: Vec<String>,
    /// The numbers behind the figure, or the result itself when there is no figure.
    pub table: Option<Table>,
    /// Remarks: caveats, conditions, anomalies. Each one is a list item.
    pub notes: Vec<String>,
    /// The exact commands that reproduce the section, one per entry.
    pub commands: Vec<String>,
    /// File names of the data (JSON, CSV), relative to the page.
    pub data_files: Vec<String>,
}

/// A table of text cells. Columns whose cells all read as numbers are right-aligned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    /// Column headings.
    pub header: Vec<String>,
    /// Rows; a row shorter than the header is padded with empty cells.
    pub rows: Vec<Vec<String>>,
}

const STYLE: &str = "\
:root { color-scheme: light; --muted: #5f6368; --rule: #d9d9de; --code: #f4f4f6; }
* { box-sizing: border-box; }
body { margin: 0 auto; max-width: 62rem; padding: 1.5rem 1.25rem 4rem;
  font: 16px/1.5 system-ui, -apple-system, \"Segoe UI\", Roboto, \"DejaVu Sans\", sans-serif;
  color: #1f2328; background: #fff; }
header { border-bottom: 2px solid var(--rule); margin-bottom: 1.5rem; }
h1 { font-size: 1.9rem; margin: 0 0 .25rem; }
h2 { font-size: 1.35rem; margin: 0 0 .5rem; }
h3 { font-size: 1rem; margin: 1.25rem 0 .4rem; }
h2 a { color: inherit; text-decoration: none; }
h2 a:hover::after { content: \" #\"; color: var(--muted); }
a { color: #0b57d0; }
.generated, .paper { color: var(--muted); }
.paper { font-size: .95rem; margin-top: -.25rem; }
nav { background: var(--code); border-radius: 6px; padding: .75rem 1.25rem; margin: 1.5rem 0; }
nav h2 { font-size: 1rem; margin: 0; }
nav ol { margin: .4rem 0 0; padding-left: 1.4rem; }
.env { display: flex; flex-wrap: wrap; gap: 0 2.5rem; }
.env > div { flex: 1 1 22rem; }
section.figure { border-top: 1px solid var(--rule); padding-top: 1.25rem; margin-top: 2rem; }
.reading { font-size: 1.05rem; }
figure { margin: 1rem 0; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid var(--rule); }
table { border-collapse: collapse; margin: .75rem 0; font-size: .92rem; }
th, td { border-bottom: 1px solid var(--rule); padding: .3rem .7rem; text-align: left;
  vertical-align: top; }
th { background: var(--code); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.kv th { background: none; font-weight: 600; white-space: nowrap; }
.scroll { overflow-x: auto; }
pre { background: var(--code); border-radius: 6px; padding: .75rem 1rem; overflow-x: auto;
  font-size: .88rem; line-height: 1.4; }
code, pre { font-family: ui-monospace, \"DejaVu Sans Mono\", Menlo, Consolas, monospace; }
.top { font-size: .85rem; }
@media print { nav, .top { display: none; } section.figure { break-inside: avoid; } }
";

/// Escapes text for use in HTML content and in quoted attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// The anchor for a section id: ASCII letters, digits, `-` and `_` kept, anything else `-`
/// (an empty id becomes `section`).
pub fn anchor(id: &str) -> String {
    if id.is_empty() {
        return "section".to_string();
    }
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// A relative link to a file beside the page: every byte outside the unreserved characters
/// and `/` is percent-encoded, so a name can neither become a scheme (`javascript:`) nor be
/// cut at `#` or `?`.
fn href(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Whether a cell reads as a number (`1.58×`, `696 ns`, `-3`, `12 %`): it starts with a digit,
/// possibly after a sign.
fn numeric(cell: &str) -> bool {
    let t = cell.trim();
    let t = t.strip_prefix(['-', '+', '−']).unwrap_or(t);
    t.chars().next().is_some_and(|c| c.is_ascii_digit())
}

/// Writes text as paragraphs: a blank line separates two.
fn paragraphs(out: &mut String, text: &str) {
    let mut para = Vec::new();
    for line in text.lines().chain([""]) {
        if line.trim().is_empty() {
            if !para.is_empty() {
                let _ = writeln!(out, "<p>{}</p>", escape(&para.join(" ")));
                para.clear();
            }
        } else {
            para.push(line.trim());
        }
    }
}

fn key_values(out: &mut String, caption: &str, rows: &[(String, String)]) {
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "<div>\n<h2>{}</h2>\n<table class=\"kv\">",
        escape(caption)
    );
    for (k, v) in rows {
        let _ = writeln!(
            out,
            "<tr><th scope=\"row\">{}</th><td>{}</td></tr>",
            escape(k),
            escape(v)
        );
    }
    out.push_str("</table>\n</div>\n");
}

/// Cell `i` of a row, empty past its end.
fn cell(row: &[String], i: usize) -> &str {
    row.get(i).map(String::as_str).unwrap_or("")
}

fn table(out: &mut String, t: &Table) {
    let width = t.rows.iter().map(Vec::len).fold(t.header.len(), usize::max);
    // A column is numeric when it has a value and every value in it reads as a number.
    let num: Vec<bool> = (0..width)
        .map(|i| {
            let mut cells = t
                .rows
                .iter()
                .map(|r| cell(r, i))
                .filter(|c| !c.trim().is_empty());
            let first = cells.next();
            first.is_some_and(numeric) && cells.all(numeric)
        })
        .collect();
    let class = |i: usize| if num[i] { " class=\"num\"" } else { "" };
    out.push_str("<div class=\"scroll\"><table>\n");
    if !t.header.is_empty() {
        out.push_str("<thead><tr>");
        for i in 0..width {
            let _ = write!(
                out,
                "<th scope=\"col\"{}>{}</th>",
                class(i),
                escape(cell(&t.header, i))
            );
        }
        out.push_str("</tr></thead>\n");
    }
    out.push_str("<tbody>\n");
    for row in &t.rows {
        out.push_str("<tr>");
        for i in 0..width {
            let _ = write!(out, "<td{}>{}</td>", class(i), escape(cell(row, i)));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table></div>\n");
}

fn section(out: &mut String, s: &Section, id: &str) {
    let _ = writeln!(
        out,
        "<section class=\"figure\" id=\"{id}\">\n<h2><a href=\"#{id}\">{}</a></h2>",
        escape(&s.title)
    );
    if !s.reading.is_empty() {
        let _ = writeln!(
            out,
            "<p class=\"reading\"><strong>{}</strong></p>",
            escape(&s.reading)
        );
    }
    if let Some(paper) = &s.paper {
        let _ = writeln!(out, "<p class=\"paper\">Paper: {}</p>", escape(paper));
    }
    for image in &s.images {
        let _ = writeln!(
            out,
            "<figure><a href=\"{src}\"><img src=\"{src}\" alt=\"{alt}\" width=\"900\" \
             height=\"540\" loading=\"lazy\"></a></figure>",
            src = href(image),
            alt = escape(&s.title)
        );
    }
    if let Some(t) = &s.table {
        table(out, t);
    }
    if !s.notes.is_empty() {
        out.push_str("<ul class=\"notes\">\n");
        for note in &s.notes {
            let _ = writeln!(out, "<li>{}</li>", escape(note));
        }
        out.push_str("</ul>\n");
    }
    if !s.commands.is_empty() {
        let commands: Vec<String> = s.commands.iter().map(|c| escape(c)).collect();
        let _ = writeln!(
            out,
            "<h3>Reproduce</h3>\n<pre><code>{}</code></pre>",
            commands.join("\n")
        );
    }
    if !s.data_files.is_empty() {
        let links: Vec<String> = s
            .data_files
            .iter()
            .map(|f| format!("<a href=\"{}\">{}</a>", href(f), escape(f)))
            .collect();
        let _ = writeln!(out, "<p class=\"data\">Data: {}</p>", links.join(", "));
    }
    out.push_str("<p class=\"top\"><a href=\"#top\">Back to contents</a></p>\n</section>\n");
}

/// Renders a page to HTML text (what [`write_page`] writes).
pub fn render_page(p: &Page) -> String {
    let mut out = String::new();
    let title = escape(&p.title);
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{title}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n\
         <header id=\"top\">\n<h1>{title}</h1>\n"
    );
    if !p.generated.is_empty() {
        let _ = writeln!(
            out,
            "<p class=\"generated\">Generated {}</p>",
            escape(&p.generated)
        );
    }
    out.push_str("</header>\n<main>\n");
    paragraphs(&mut out, &p.intro);

    // Anchors are made unique: two sections given the same id still get a link each.
    let mut ids: Vec<String> = Vec::with_capacity(p.sections.len());
    for s in &p.sections {
        let base = anchor(&s.id);
        let mut id = base.clone();
        let mut n = 2;
        while ids.contains(&id) || id == "top" || id == "machine" {
            id = format!("{base}-{n}");
            n += 1;
        }
        ids.push(id);
    }

    let has_env = !p.machine.is_empty() || !p.versions.is_empty();
    out.push_str("<nav>\n<h2>Contents</h2>\n<ol>\n");
    if has_env {
        out.push_str("<li><a href=\"#machine\">Machine and versions</a></li>\n");
    }
    for (s, id) in p.sections.iter().zip(&ids) {
        let _ = writeln!(out, "<li><a href=\"#{id}\">{}</a></li>", escape(&s.title));
    }
    out.push_str("</ol>\n</nav>\n");

    if has_env {
        out.push_str("<section class=\"env\" id=\"machine\">\n");
        key_values(&mut out, "Machine", &p.machine);
        key_values(&mut out, "Versions", &p.versions);
        out.push_str("</section>\n");
    }
    for (s, id) in p.sections.iter().zip(&ids) {
        section(&mut out, s, id);
    }
    out.push_str("</main>\n</body>\n</html>\n");
    out
}

/// Writes a page as one HTML file at `path`. Images and data files are referred to by their
/// names relative to it and are not touched.
pub fn write_page(p: &Page, path: &Path) -> std::io::Result<()> {
    std::fs::write(path, render_page(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page() -> Page {
        let section = |id: &str, title: &str| Section {
            id: id.to_string(),
            title: title.to_string(),
            reading: format!("{title}: moneta-raw is 0.93x the kernel at 512 B"),
            paper: Some("Moneta-D: 1.9x faster than the kernel at 512 B".to_string()),
            images: vec![format!("{id}.png")],
            table: Some(Table {
                header: vec!["op".into(), "size".into(), "p50".into()],
                rows: vec![
                    vec!["read".into(), "512 B".into(), "696 ns".into()],
                    vec!["write".into(), "4 KiB".into()],
                ],
            }),
            notes: vec!["a note with <script>alert('x')</script> & \"quotes\"".to_string()],
            commands: vec![format!(
                "./target/release/moneta bench --size 512,4K > {id}.json"
            )],
            data_files: vec![format!("{id}.json"), format!("{id} run#2.csv")],
        };
        Page {
            title: "Moneta <report>".to_string(),
            generated: "2026-11-23 08:54 UTC".to_string(),
            machine: vec![("CPU".into(), "Intel Xeon @ 2.5 GHz".into())],
            versions: vec![("moneta".into(), "0.1.0".into())],
            intro: "First paragraph,\nstill the first.\n\nSecond <b>paragraph</b>.".to_string(),
            sections: vec![
                section("latency", "Latency"),
                section("bandwidth", "Bandwidth"),
            ],
        }
    }

    /// Checks that tags open and close in order (void elements excepted).
    fn balanced(html: &str) -> Result<(), String> {
        const VOID: &[&str] = &["meta", "img", "br", "hr", "link", "input", "wbr"];
        let mut stack: Vec<String> = Vec::new();
        let mut rest = html;
        while let Some(start) = rest.find('<') {
            let end = rest[start..].find('>').ok_or("unclosed tag")? + start;
            let tag = &rest[start + 1..end];
            rest = &rest[end + 1..];
            if tag.starts_with('!') {
                continue;
            }
            let closing = tag.starts_with('/');
            let name: String = tag
                .trim_start_matches('/')
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if name.is_empty() {
                return Err(format!("bad tag <{tag}>"));
            }
            if closing {
                match stack.pop() {
                    Some(open) if open == name => {}
                    other => return Err(format!("</{name}> closes {other:?}")),
                }
            } else if !VOID.contains(&name.as_str()) {
                stack.push(name);
            }
        }
        if stack.is_empty() {
            Ok(())
        } else {
            Err(format!("left open: {stack:?}"))
        }
    }

    #[test]
    fn writes_a_page() {
        let dir = std::env::temp_dir().join(format!("moneta-html-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create test directory");
        let path = dir.join("index.html");
        write_page(&page(), &path).expect("write page");
        let html = std::fs::read_to_string(&path).expect("read page");
        let _ = std::fs::remove_dir_all(&dir);

        balanced(&html).expect("well-formed");
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert_eq!(html.matches("<html").count(), 1);
        for id in ["latency", "bandwidth"] {
            assert!(html.contains(&format!("id=\"{id}\"")), "anchor {id}");
            assert!(html.contains(&format!("href=\"#{id}\"")), "link to {id}");
            assert!(
                html.contains(&format!("<img src=\"{id}.png\"")),
                "image {id}"
            );
            assert!(html.contains(&format!("href=\"{id}.json\"")), "data {id}");
            assert!(html.contains(&format!("href=\"{id}%20run%232.csv\">{id} run#2.csv</a>")));
        }
        assert!(!html.contains("<script"), "script not escaped");
        assert!(html.contains("&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"));
        assert!(html.contains("&amp; &quot;quotes&quot;"));
        assert!(html.contains("<title>Moneta &lt;report&gt;</title>"));
        assert!(html.contains("<p>First paragraph, still the first.</p>"));
        assert!(html.contains("<p>Second &lt;b&gt;paragraph&lt;/b&gt;.</p>"));
        assert!(html.contains("<strong>Latency: moneta-raw is 0.93x"));
        assert!(html.contains(
            "<pre><code>./target/release/moneta bench --size 512,4K &gt; latency.json</code></pre>"
        ));
        // Size and p50 columns are numeric, the op column not; the short row is padded.
        assert!(
            html.contains("<td>read</td><td class=\"num\">512 B</td><td class=\"num\">696 ns</td>")
        );
        assert!(html.contains("<td>write</td><td class=\"num\">4 KiB</td><td class=\"num\"></td>"));
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "external resource"
        );
    }

    #[test]
    fn anchors_and_links() {
        assert_eq!(anchor("fig 3/latency"), "fig-3-latency");
        assert_eq!(anchor(""), "section");
        assert_eq!(href("javascript:alert(1)"), "javascript%3Aalert%281%29");
        assert_eq!(href("figs/a-b_c.png"), "figs/a-b_c.png");
        assert_eq!(
            escape("<a href=\"x\">'&'</a>"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
        let mut p = page();
        p.sections[1].id = "latency".to_string();
        let html = render_page(&p);
        assert!(html.contains("id=\"latency\"") && html.contains("id=\"latency-2\""));
        balanced(&html).expect("well-formed");
    }
}
