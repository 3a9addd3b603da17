//! Figures of `moneta report`: line charts and bar charts drawn to PNG files.
//!
//! This file owns the chart data model ([`Chart`], [`Series`], [`BarChart`]), the axis layout
//! (linear and logarithmic scales, tick placement, tick labels such as `4K` for sizes), the font
//! that every label is drawn with, and the PNG writer. It knows nothing about experiments: the
//! caller hands it numbers and labels, and keeps its own data files, which stay the source of
//! truth when a figure cannot be drawn (for instance on a machine without a font).
//!
//! Values that cannot be drawn (NaN, infinities, zero or negative values on a log axis) are
//! skipped rather than reported as errors, so one bad measurement never costs a whole figure; a
//! figure with nothing left to draw still gets its axes and a "no data" note.

use std::ffi::OsString;
use std::fmt::Display;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Width of every figure, in pixels.
pub const WIDTH: u32 = 900;
/// Height of every figure, in pixels.
pub const HEIGHT: u32 = 540;

/// Environment variable naming a TrueType font file to draw with instead of the embedded
/// DejaVu Sans.
pub const FONT_ENV: &str = "MONETA_FONT";

/// Largest font file read from `$MONETA_FONT`.
const FONT_MAX_BYTES: u64 = 32 << 20;

/// The family name the font is registered under and every text style asks for.
const FAMILY: &str = "sans-serif";

/// Most tick labels on one axis; log axes skip powers beyond this.
const MAX_TICKS: usize = 14;

/// Why a figure could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The font named by `$MONETA_FONT` could not be loaded.
    #[error("cannot draw with the font {FONT_ENV} names ({0}); the data files are written anyway")]
    NoFont(String),
    /// The drawing library failed (the message is its own).
    #[error("drawing the figure failed: {0}")]
    Draw(String),
    /// The finished image could not be put in place.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file being written.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
}

/// One line of a [`Chart`].
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Name shown in the legend.
    pub label: String,
    /// `(x, y)` points, joined in the order given. Points that cannot be drawn on the chart's
    /// scales are skipped and break the line there.
    pub points: Vec<(f64, f64)>,
    /// Draw the line dashed (e.g. for a reference or a model rather than a measurement).
    pub dashed: bool,
}

/// How an axis maps values to positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scale {
    /// Evenly spaced values; ticks at 1, 2 or 5 times a power of ten.
    #[default]
    Linear,
    /// Logarithmic, ticks at powers of two labelled the way sizes are written
    /// (`512`, `4K`, `64K`, `1M`; see [`format_bytes`]). Values `<= 0` are skipped.
    Log2,
    /// Logarithmic, ticks at powers of ten labelled `1`, `10`, `100`, `1k`, `10k`, ...
    /// (see [`format_si`]). Values `<= 0` are skipped.
    Log10,
}

/// A line chart: one or more [`Series`] against shared axes.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// Title drawn above the chart.
    pub title: String,
    /// Description of the x axis, units included (e.g. `"request size (bytes)"`).
    pub x_label: String,
    /// Description of the y axis, units included (e.g. `"p50 latency (ns)"`).
    pub y_label: String,
    /// Scale of the x axis.
    pub x_scale: Scale,
    /// Scale of the y axis.
    pub y_scale: Scale,
    /// The lines; each gets its own color and marker, in this order.
    pub series: Vec<Series>,
    /// Start a linear y axis at zero (or end it there if every value is negative) so that
    /// heights can be compared as ratios. Ignored on log axes.
    pub y_from_zero: bool,
}

/// A bar chart: one bar per group in each category, or one stacked bar per category.
///
/// For a latency breakdown, the categories are the configurations (`"moneta 512 B"`,
/// `"kernel 512 B"`) and the groups the components (`"lookup"`, `"permission check"`,
/// `"copy"`), stacked bottom to top in the order given.
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    /// Title drawn above the chart.
    pub title: String,
    /// Description of the y axis, units included.
    pub y_label: String,
    /// Names along the x axis, left to right.
    pub categories: Vec<String>,
    /// `(name, values)`: `values[i]` belongs to `categories[i]`. A missing or non-finite
    /// value draws no bar; in a stacked chart, negative values are skipped too.
    pub groups: Vec<(String, Vec<f64>)>,
    /// Stack the groups into one bar per category (its total is written above it) instead of
    /// drawing them side by side.
    pub stacked: bool,
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// Colors of successive series and bar groups (Okabe and Ito's palette, which stays distinct
/// for color-blind readers, with black last).
const PALETTE: &[RGBColor] = &[
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(170, 150, 0),
    RGBColor(0, 0, 0),
];

const GRID_BOLD: RGBColor = RGBColor(210, 210, 210);
const GRID_LIGHT: RGBColor = RGBColor(236, 236, 236);
const MUTED: RGBColor = RGBColor(110, 110, 110);

/// Markers of successive series. Six markers against eight colors: the pair repeats only after
/// 24 series.
#[derive(Debug, Clone, Copy)]
enum Marker {
    Circle,
    Square,
    Triangle,
    Diamond,
    Cross,
    Ring,
}

const MARKERS: &[Marker] = &[
    Marker::Circle,
    Marker::Square,
    Marker::Triangle,
    Marker::Diamond,
    Marker::Cross,
    Marker::Ring,
];

fn draw_err(e: impl Display) -> PlotError {
    PlotError::Draw(e.to_string())
}

// ---------------------------------------------------------------------------------------------
// Font

static FONT: OnceLock<Result<String, String>> = OnceLock::new();

/// Makes sure a font is registered for drawing text (the first call in the process loads it)
/// and says which: the file `$MONETA_FONT` names if that is set, else DejaVu Sans, built into
/// the program so figures look the same on every machine. The renderers call this
/// themselves; a caller may call it first to learn early whether figures can be drawn.
pub fn ensure_font() -> Result<&'static str, PlotError> {
    match FONT.get_or_init(|| load_font(std::env::var_os(FONT_ENV))) {
        Ok(name) => Ok(name.as_str()),
        Err(why) => Err(PlotError::NoFont(why.clone())),
    }
}

fn load_font(env: Option<OsString>) -> Result<String, String> {
    let Some(path) = env.filter(|p| !p.is_empty()).map(PathBuf::from) else {
        register(dejavu::sans::regular())?;
        return Ok("DejaVu Sans (built in)".into());
    };
    let len = std::fs::metadata(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    if len > FONT_MAX_BYTES {
        return Err(format!(
            "{}: {len} bytes, more than the {FONT_MAX_BYTES} read",
            path.display()
        ));
    }
    let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    // plotters keeps fonts in a process-wide table that wants `'static` bytes; this runs once
    // per process, so leaking the file's bytes is bounded.
    register(Box::leak(bytes.into_boxed_slice()))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path.display().to_string())
}

/// Registers a font as the sans-serif family.
fn register(bytes: &'static [u8]) -> Result<(), String> {
    plotters::style::register_font(FAMILY, FontStyle::Normal, bytes)
        .map_err(|_| "not a TrueType or OpenType font".to_string())
}

// ---------------------------------------------------------------------------------------------
// Number formatting

/// Writes `v` with at most `decimals` decimals, without trailing zeros (`1.50` → `1.5`).
fn trim(v: f64, decimals: usize) -> String {
    let s = format!("{v:.decimals$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" {
        "0".to_string()
    } else {
        s
    }
}

/// Formats a size in bytes the way sizes label an axis: binary multiples with a one-letter
/// suffix and no unit, up to two decimals: 512 → `512`, 4096 → `4K`, 1536 → `1.5K`,
/// 4 MiB → `4M`.
pub fn format_bytes(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let sign = if v < 0.0 { "-" } else { "" };
    let mut m = v.abs();
    for suffix in ["", "K", "M", "G", "T", "P"] {
        if m < 1024.0 {
            return format!("{sign}{}{suffix}", trim(m, 2));
        }
        m /= 1024.0;
    }
    format!("{sign}{}E", trim(m, 2))
}

/// Formats a number with a decimal (SI) suffix: `1k`, `12.5k`, `3M`, `2G`; numbers below 1000
/// keep up to three significant decimals (`0.25`, `0.001`), smaller ones use an exponent.
pub fn format_si(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    if v == 0.0 {
        return "0".to_string();
    }
    let sign = if v < 0.0 { "-" } else { "" };
    let mut m = v.abs();
    if m < 1e-3 {
        return format!("{sign}{m:.0e}");
    }
    if m < 1.0 {
        return format!("{sign}{}", trim(m, 3));
    }
    for suffix in ["", "k", "M", "G", "T", "P"] {
        if m < 1000.0 {
            return format!("{sign}{}{suffix}", trim(m, 2));
        }
        m /= 1000.0;
    }
    format!("{sign}{}E", trim(m, 2))
}

// ---------------------------------------------------------------------------------------------
// Axes

/// Maps a value to its position on a scale's axis (the chart itself is drawn in these
/// transformed coordinates), or `None` if the value cannot be drawn there.
fn transform(scale: Scale, v: f64) -> Option<f64> {
    let t = match scale {
        Scale::Linear => v,
        Scale::Log2 if v > 0.0 => v.log2(),
        Scale::Log10 if v > 0.0 => v.log10(),
        Scale::Log2 | Scale::Log10 => return None,
    };
    t.is_finite().then_some(t)
}

/// The layout of one axis, in transformed coordinates.
#[derive(Debug, Clone)]
struct Axis {
    scale: Scale,
    lo: f64,
    hi: f64,
    /// Labelled ticks, with a grid line each.
    ticks: Vec<f64>,
    /// Unlabelled, lighter grid lines.
    light: Vec<f64>,
    /// Decimals of linear tick labels.
    decimals: usize,
    /// Label linear ticks with SI suffixes (large numbers).
    si: bool,
}

impl Axis {
    /// Lays out an axis around transformed values (all finite).
    fn fit(scale: Scale, values: &[f64], from_zero: bool) -> Axis {
        let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let data = (lo.is_finite() && hi.is_finite()).then_some((lo, hi));
        match scale {
            Scale::Linear => Self::fit_linear(data, from_zero),
            Scale::Log2 | Scale::Log10 => Self::fit_log(scale, data),
        }
    }

    fn fit_linear(data: Option<(f64, f64)>, from_zero: bool) -> Axis {
        let (mut lo, mut hi) = data.unwrap_or((0.0, 1.0));
        if from_zero {
            lo = lo.min(0.0);
            hi = hi.max(0.0);
        }
        if hi - lo <= f64::EPSILON * hi.abs().max(1.0) {
            let pad = (hi.abs() * 0.1).max(1.0);
            (lo, hi) = (lo - pad, hi + pad);
            if from_zero && data.is_some_and(|(l, _)| l >= 0.0) {
                lo = 0.0;
            }
        }
        let step = nice_step((hi - lo) / 6.0);
        // A little room beyond the extreme points so that their markers are not cut (except at
        // a zero the axis was asked to start from), rounded out to a tick when that costs
        // little space.
        let pad = (hi - lo) * 0.03;
        let slack = (hi - lo) * 0.1;
        let lo = if from_zero && lo == 0.0 {
            0.0
        } else {
            let rounded = ((lo - pad) / step).floor() * step;
            if lo - rounded <= slack {
                rounded
            } else {
                lo - pad
            }
        };
        let hi = if from_zero && hi == 0.0 {
            0.0
        } else {
            let rounded = ((hi + pad) / step).ceil() * step;
            if rounded - hi <= slack {
                rounded
            } else {
                hi + pad
            }
        };
        let first = (lo / step).ceil() as i64;
        let last = (hi / step).floor() as i64;
        let ticks: Vec<f64> = (first..=last).map(|k| k as f64 * step).collect();
        let top = lo.abs().max(hi.abs());
        Axis {
            scale: Scale::Linear,
            lo,
            hi,
            ticks,
            light: Vec::new(),
            decimals: (-step.log10().floor()).clamp(0.0, 9.0) as usize,
            si: top >= 1e5,
        }
    }

    fn fit_log(scale: Scale, data: Option<(f64, f64)>) -> Axis {
        let (mut lo, mut hi) = data.unwrap_or((0.0, 1.0));
        // At least two powers of two, or one decade, so that there are ticks to read.
        let min_span = if scale == Scale::Log2 { 2.0 } else { 1.0 };
        if hi - lo < min_span {
            let mid = (lo + hi) / 2.0;
            (lo, hi) = (mid - min_span / 2.0, mid + min_span / 2.0);
        }
        let pad = (hi - lo) * 0.04;
        let (lo, hi) = (lo - pad, hi + pad);
        let first = lo.ceil() as i64;
        let last = hi.floor() as i64;
        let count = (last - first + 1).max(0) as usize;
        let stride = count.div_ceil(MAX_TICKS).max(1) as i64;
        let mut ticks = Vec::new();
        let mut light = Vec::new();
        for k in first..=last {
            if k.rem_euclid(stride) == 0 {
                ticks.push(k as f64);
            } else {
                light.push(k as f64);
            }
        }
        if scale == Scale::Log10 {
            // Within a decade: 2..9 as light lines, and 2 and 5 labelled when the axis
            // spans too few decades to read values off it.
            let few = ticks.len() < 3;
            if count <= 6 {
                for k in (first - 1)..=last {
                    for m in 2..=9 {
                        let t = k as f64 + f64::from(m).log10();
                        if t < lo || t > hi {
                            continue;
                        }
                        if few && (m == 2 || m == 5) {
                            ticks.push(t);
                        } else {
                            light.push(t);
                        }
                    }
                }
                ticks.sort_by(f64::total_cmp);
            }
        }
        Axis {
            scale,
            lo,
            hi,
            ticks,
            light,
            decimals: 0,
            si: false,
        }
    }

    /// The label of a tick at transformed position `t`.
    fn label(&self, t: f64) -> String {
        match self.scale {
            Scale::Linear if self.si => format_si(t),
            Scale::Linear => trim(t, self.decimals),
            Scale::Log2 => format_bytes(round_near(t.exp2())),
            Scale::Log10 => format_si(round_near(10f64.powf(t))),
        }
    }

    /// A value (not a tick) written with a precision suited to this axis: one more decimal
    /// than its ticks, trailing zeros dropped.
    fn label_exact(&self, v: f64) -> String {
        match self.scale {
            Scale::Linear if self.si => format_si(v),
            Scale::Linear => trim(v, self.decimals + 1),
            _ => self.label(v),
        }
    }
}

/// The axis is its own plotters coordinate: a plain linear mapping of the transformed values,
/// with the ticks and grid lines laid out above.
impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.hi - self.lo;
        if span <= 0.0 || !v.is_finite() {
            return (limit.0 + limit.1) / 2;
        }
        let frac = (v - self.lo) / span;
        limit.0 + (f64::from(limit.1 - limit.0) * frac).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

/// Undoes the rounding error of `exp2`/`powf` on integral results (2^12 = 4095.999…).
fn round_near(v: f64) -> f64 {
    let r = v.round();
    if (v - r).abs() <= 1e-9 * v.abs().max(1.0) {
        r
    } else {
        v
    }
}

/// The tick step for a span divided into about `raw`-sized pieces: 1, 2 or 5 times a power
/// of ten.
fn nice_step(raw: f64) -> f64 {
    if !(raw.is_finite() && raw > 0.0) {
        return 1.0;
    }
    let pow = 10f64.powf(raw.log10().floor());
    let m = raw / pow;
    let nice = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * pow
}

// ---------------------------------------------------------------------------------------------
// Drawing

/// Draws into a temporary PNG beside `path` and renames it into place, so that a failed
/// drawing never leaves a truncated image under the final name.
fn render_png(
    path: &Path,
    draw: impl FnOnce(&Area<'_>) -> Result<(), PlotError>,
) -> Result<(), PlotError> {
    ensure_font()?;
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "figure".to_string());
    // The image encoder picks the format from the extension, hence `.png` at the end.
    let tmp = path.with_file_name(format!(
        ".{name}.{}.{}.tmp.png",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let drawn = {
        let root = BitMapBackend::new(&tmp, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE)
            .map_err(draw_err)
            .and_then(|()| draw(&root))
            .and_then(|()| root.present().map_err(draw_err))
        // `root` is dropped here, which would write the file if `present` was not reached.
    };
    let placed = drawn.and_then(|()| {
        std::fs::rename(&tmp, path).map_err(|source| PlotError::Io {
            path: path.to_path_buf(),
            source,
        })
    });
    if placed.is_err() {
        // Best effort: the error that matters is the one returned.
        let _ = std::fs::remove_file(&tmp);
    }
    placed
}

fn font(size: u32) -> TextStyle<'static> {
    (FAMILY, size).into_font().into()
}

/// One legend row: the series' name, color, marker, and line or box sample.
struct LegendEntry {
    label: String,
    color: RGBColor,
    sample: Sample,
}

enum Sample {
    Line { marker: Marker, dashed: bool },
    Box,
}

const LEGEND_MIN: u32 = 110;
const LEGEND_MAX: u32 = 280;
const LEGEND_ROW: i32 = 22;
const LEGEND_TEXT_X: i32 = 44;

/// Splits off a legend column on the right of `area` sized for the labels (within bounds)
/// and draws the legend there; returns the area left for the plot.
fn with_legend<'a>(area: &Area<'a>, entries: &mut [LegendEntry]) -> Result<Area<'a>, PlotError> {
    if entries.is_empty() {
        return Ok(area.clone());
    }
    let style = font(13);
    let widest = entries
        .iter()
        .map(|e| area.estimate_text_size(&e.label, &style).map(|(w, _)| w))
        .try_fold(0, |acc, w| w.map(|w| acc.max(w)))
        .map_err(draw_err)?;
    let width = (widest + LEGEND_TEXT_X as u32 + 12).clamp(LEGEND_MIN, LEGEND_MAX);
    let text_room = width - LEGEND_TEXT_X as u32 - 8;
    for e in entries.iter_mut() {
        e.label = fit_text(area, &e.label, &style, text_room)?;
    }
    let (w, _) = area.dim_in_pixel();
    let (plot, legend) = area.split_horizontally(w.saturating_sub(width));
    // Rows start level with the top of the plotting area (below the chart's margin).
    let mut y = 24;
    for e in entries.iter() {
        draw_sample(&legend, e, y)?;
        legend
            .draw(&Text::new(
                e.label.clone(),
                (LEGEND_TEXT_X, y),
                style.pos(Pos::new(HPos::Left, VPos::Center)),
            ))
            .map_err(draw_err)?;
        y += LEGEND_ROW;
    }
    Ok(plot)
}

/// Shortens `text` with an ellipsis until it fits in `room` pixels.
fn fit_text(
    area: &Area<'_>,
    text: &str,
    style: &TextStyle,
    room: u32,
) -> Result<String, PlotError> {
    let width = |s: &str| area.estimate_text_size(s, style).map(|(w, _)| w);
    if width(text).map_err(draw_err)? <= room {
        return Ok(text.to_string());
    }
    let mut chars: Vec<char> = text.chars().collect();
    while !chars.is_empty() {
        chars.pop();
        let s: String = chars.iter().collect::<String>() + "…";
        if width(&s).map_err(draw_err)? <= room {
            return Ok(s);
        }
    }
    Ok("…".to_string())
}

fn draw_sample(legend: &Area<'_>, e: &LegendEntry, y: i32) -> Result<(), PlotError> {
    match e.sample {
        Sample::Line { marker, dashed } => {
            let style = e.color.stroke_width(2);
            let pieces: &[(i32, i32)] = if dashed {
                &[(6, 13), (17, 24), (28, 35)]
            } else {
                &[(6, 35)]
            };
            for &(a, b) in pieces {
                legend
                    .draw(&PathElement::new(vec![(a, y), (b, y)], style))
                    .map_err(draw_err)?;
            }
            draw_marker(legend, marker, (20, y), e.color)
        }
        Sample::Box => legend
            .draw(&Rectangle::new([(8, y - 6), (32, y + 6)], e.color.filled()))
            .map_err(draw_err),
    }
}

/// Draws a marker centered on `at` (in the area's own coordinates).
fn draw_marker<CT>(
    area: &DrawingArea<BitMapBackend<'_>, CT>,
    marker: Marker,
    at: CT::From,
    color: RGBColor,
) -> Result<(), PlotError>
where
    CT: CoordTranslate,
    CT::From: Clone,
{
    let filled = color.filled();
    let stroke = color.stroke_width(2);
    let at = EmptyElement::at(at);
    match marker {
        Marker::Circle => area.draw(&(at + Circle::new((0, 0), 4, filled))),
        Marker::Square => area.draw(&(at + Rectangle::new([(-4, -4), (4, 4)], filled))),
        Marker::Triangle => area.draw(&(at + TriangleMarker::new((0, 0), 6, filled))),
        Marker::Diamond => {
            area.draw(&(at + Polygon::new(vec![(0, -5), (5, 0), (0, 5), (-5, 0)], filled)))
        }
        Marker::Cross => area.draw(&(at + Cross::new((0, 0), 4, stroke))),
        Marker::Ring => area.draw(&(at + Circle::new((0, 0), 4, stroke))),
    }
    .map_err(draw_err)
}

/// Writes "no data" in the middle of an area.
fn no_data(area: &Area<'_>) -> Result<(), PlotError> {
    let (w, h) = area.dim_in_pixel();
    area.draw(&Text::new(
        "no data",
        (w as i32 / 2, h as i32 / 2),
        font(18)
            .color(&MUTED)
            .pos(Pos::new(HPos::Center, VPos::Center)),
    ))
    .map_err(draw_err)
}

/// Draws a line chart to a PNG file of [`WIDTH`] × [`HEIGHT`] pixels at `path`.
///
/// Each series gets a color and a marker of its own, listed in a legend on the right. Points
/// that cannot be drawn are skipped (see [`Series::points`]); a series left with none is
/// listed as "(no data)", and a chart left with none gets its axes and a "no data" note.
/// Fails with [`PlotError::NoFont`] when no font can be found, before touching `path`.
pub fn render_chart(c: &Chart, path: &Path) -> Result<(), PlotError> {
    // Each series becomes runs of consecutive drawable points, in transformed coordinates.
    let runs: Vec<Vec<Vec<(f64, f64)>>> = c
        .series
        .iter()
        .map(|s| {
            let mut runs = vec![Vec::new()];
            for &(x, y) in &s.points {
                match (transform(c.x_scale, x), transform(c.y_scale, y)) {
                    (Some(x), Some(y)) => {
                        if let Some(run) = runs.last_mut() {
                            run.push((x, y));
                        }
                    }
                    _ => runs.push(Vec::new()),
                }
            }
            runs.retain(|r| !r.is_empty());
            runs
        })
        .collect();
    let all = || runs.iter().flatten().flatten();
    let xs: Vec<f64> = all().map(|p| p.0).collect();
    let ys: Vec<f64> = all().map(|p| p.1).collect();
    let x_axis = Axis::fit(c.x_scale, &xs, false);
    let y_axis = Axis::fit(c.y_scale, &ys, c.y_from_zero);

    let style_of = |i: usize| (PALETTE[i % PALETTE.len()], MARKERS[i % MARKERS.len()]);
    let mut legend: Vec<LegendEntry> = c
        .series
        .iter()
        .zip(&runs)
        .enumerate()
        .map(|(i, (s, r))| {
            let (color, marker) = style_of(i);
            LegendEntry {
                label: if r.is_empty() {
                    format!("{} (no data)", s.label)
                } else {
                    s.label.clone()
                },
                color,
                sample: Sample::Line {
                    marker,
                    dashed: s.dashed,
                },
            }
        })
        .collect();

    render_png(path, |root| {
        let area = root.titled(&c.title, font(22)).map_err(draw_err)?;
        let plot_area = with_legend(&area, &mut legend)?;
        let mut chart = ChartBuilder::on(&plot_area)
            .margin(12)
            .x_label_area_size(52)
            .y_label_area_size(78)
            .build_cartesian_2d(x_axis.clone(), y_axis.clone())
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .bold_line_style(GRID_BOLD)
            .light_line_style(GRID_LIGHT)
            .x_desc(c.x_label.as_str())
            .y_desc(c.y_label.as_str())
            .x_label_formatter(&|t| x_axis.label(*t))
            .y_label_formatter(&|t| y_axis.label(*t))
            .label_style(font(13))
            .axis_desc_style(font(15))
            .draw()
            .map_err(draw_err)?;

        for (i, (series, series_runs)) in c.series.iter().zip(&runs).enumerate() {
            let (color, marker) = style_of(i);
            let line = color.stroke_width(2);
            for run in series_runs {
                if series.dashed {
                    chart
                        .draw_series(DashedLineSeries::new(run.iter().copied(), 8, 5, line))
                        .map_err(draw_err)?;
                } else {
                    chart
                        .draw_series(LineSeries::new(run.iter().copied(), line))
                        .map_err(draw_err)?;
                }
                let plotting = chart.plotting_area();
                for &p in run {
                    draw_marker(plotting, marker, p, color)?;
                }
            }
        }
        if xs.is_empty() {
            no_data(&plot_area)?;
        }
        Ok(())
    })
}

/// Draws a bar chart to a PNG file of [`WIDTH`] × [`HEIGHT`] pixels at `path`.
///
/// Grouped bars stand side by side within their category; stacked bars pile the groups
/// bottom to top in the order given and carry their total above them. The y axis starts at
/// zero. Values that cannot be drawn are skipped (see [`BarChart::groups`]); a chart left
/// with none gets its axes and a "no data" note. Fails with [`PlotError::NoFont`] when no
/// font can be found, before touching `path`.
pub fn render_bars(b: &BarChart, path: &Path) -> Result<(), PlotError> {
    let n = b.categories.len();
    let value = |g: usize, i: usize| -> Option<f64> {
        let v = *b.groups.get(g)?.1.get(i)?;
        (v.is_finite() && (!b.stacked || v >= 0.0)).then_some(v)
    };
    let totals: Vec<Option<f64>> = (0..n)
        .map(|i| {
            let vs: Vec<f64> = (0..b.groups.len()).filter_map(|g| value(g, i)).collect();
            (!vs.is_empty()).then(|| vs.iter().sum())
        })
        .collect();
    let extremes: Vec<f64> = if b.stacked {
        totals.iter().flatten().copied().collect()
    } else {
        (0..b.groups.len())
            .flat_map(|g| (0..n).filter_map(move |i| value(g, i)))
            .collect()
    };
    let mut fit = extremes.clone();
    if b.stacked {
        // Room for the totals written above the bars.
        let top = extremes.iter().copied().fold(0.0, f64::max);
        fit.push(top * 1.08);
    }
    let y_axis = Axis::fit(Scale::Linear, &fit, true);

    let mut legend: Vec<LegendEntry> = b
        .groups
        .iter()
        .enumerate()
        .map(|(g, (name, _))| LegendEntry {
            label: name.clone(),
            color: PALETTE[g % PALETTE.len()],
            sample: Sample::Box,
        })
        .collect();
    // Category i spans [i, i + 1] on the x axis, its name at the middle.
    let x_axis = Axis {
        scale: Scale::Linear,
        lo: 0.0,
        hi: n.max(1) as f64,
        ticks: (0..n).map(|i| i as f64 + 0.5).collect(),
        light: Vec::new(),
        decimals: 0,
        si: false,
    };

    render_png(path, |root| {
        let area = root.titled(&b.title, font(22)).map_err(draw_err)?;
        let plot_area = with_legend(&area, &mut legend)?;
        // Category names shrink, then get shortened, until they fit their slot.
        let (w, _) = plot_area.dim_in_pixel();
        let slot = (w.saturating_sub(100) / n.max(1) as u32).max(20);
        let mut label_size = 13;
        let widest = |size: u32| -> Result<u32, PlotError> {
            b.categories.iter().try_fold(0, |acc, c| {
                let (cw, _) = plot_area
                    .estimate_text_size(c, &font(size))
                    .map_err(draw_err)?;
                Ok(acc.max(cw))
            })
        };
        while label_size > 10 && widest(label_size)? + 6 > slot {
            label_size -= 1;
        }
        let names: Vec<String> = b
            .categories
            .iter()
            .map(|c| fit_text(&plot_area, c, &font(label_size), slot.saturating_sub(6)))
            .collect::<Result<_, _>>()?;

        let mut chart = ChartBuilder::on(&plot_area)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(78)
            .build_cartesian_2d(x_axis.clone(), y_axis.clone())
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .bold_line_style(GRID_BOLD)
            .light_line_style(GRID_LIGHT)
            .y_desc(b.y_label.as_str())
            .x_label_formatter(&|t| {
                names
                    .get(t.floor().max(0.0) as usize)
                    .cloned()
                    .unwrap_or_default()
            })
            .y_label_formatter(&|t| y_axis.label(*t))
            .x_label_style(font(label_size))
            .y_label_style(font(13))
            .axis_desc_style(font(15))
            .draw()
            .map_err(draw_err)?;

        let groups = b.groups.len().max(1);
        for (i, total) in totals.iter().enumerate() {
            let left = i as f64;
            let mut base = 0.0;
            for g in 0..b.groups.len() {
                let Some(v) = value(g, i) else { continue };
                let color = PALETTE[g % PALETTE.len()];
                let (x0, x1, y0, y1) = if b.stacked {
                    let r = (left + 0.2, left + 0.8, base, base + v);
                    base += v;
                    r
                } else {
                    let width = 0.8 / groups as f64;
                    let x0 = left + 0.1 + g as f64 * width;
                    (x0, x0 + width * 0.9, 0.0, v)
                };
                chart
                    .draw_series([
                        Rectangle::new([(x0, y0), (x1, y1)], color.filled()),
                        Rectangle::new([(x0, y0), (x1, y1)], WHITE.stroke_width(1)),
                    ])
                    .map_err(draw_err)?;
            }
            if let (true, Some(total)) = (b.stacked, *total) {
                chart
                    .plotting_area()
                    .draw(
                        &(EmptyElement::at((left + 0.5, total))
                            + Text::new(
                                y_axis.label_exact(total),
                                (0, -4),
                                font(12).pos(Pos::new(HPos::Center, VPos::Bottom)),
                            )),
                    )
                    .map_err(draw_err)?;
            }
        }
        if extremes.is_empty() {
            no_data(&plot_area)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own under the system's temporary directory, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new(name: &str) -> TempDir {
            let dir =
                std::env::temp_dir().join(format!("moneta-plot-{}-{name}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("create test directory");
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Checks a rendered file: a whole PNG put in place, no temporary file left.
    fn check_png(result: Result<(), PlotError>, path: &Path) {
        if let Err(e) = result {
            panic!("render {}: {e}", path.display());
        }
        let bytes = std::fs::read(path).expect("read the image");
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
        assert!(bytes.len() > 4096, "only {} bytes", bytes.len());
        let dir = path.parent().expect("parent");
        let left: Vec<_> = std::fs::read_dir(dir)
            .expect("list")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp.png"))
            .collect();
        assert!(left.is_empty(), "temporary files left: {left:?}");
    }

    fn sizes() -> Vec<f64> {
        (9..=22).map(|k| f64::from(1u32 << k)).collect()
    }

    #[test]
    fn log_log_chart() {
        let dir = TempDir::new("loglog");
        let path = dir.0.join("latency.png");
        let line = |label: &str, base: f64, dashed: bool| Series {
            label: label.to_string(),
            points: sizes().into_iter().map(|s| (s, base + s / 3.0)).collect(),
            dashed,
        };
        let mut broken = line("moneta-raw read", 400.0, false);
        broken.points[3].1 = f64::NAN;
        broken.points[5].1 = 0.0;
        broken.points.push((-1.0, 10.0));
        let c = Chart {
            title: "Latency against request size".to_string(),
            x_label: "request size (bytes)".to_string(),
            y_label: "p50 latency (ns)".to_string(),
            x_scale: Scale::Log2,
            y_scale: Scale::Log10,
            series: vec![
                broken,
                line("kernel-psync read", 700.0, false),
                line("PCIe model", 300.0, true),
                Series {
                    label: "empty".to_string(),
                    points: vec![],
                    dashed: false,
                },
            ],
            y_from_zero: true,
        };
        check_png(render_chart(&c, &path), &path);
    }

    #[test]
    fn stacked_and_grouped_bars() {
        let dir = TempDir::new("bars");
        let mut b = BarChart {
            title: "Where a 512 B read spends its time".to_string(),
            y_label: "latency (ns)".to_string(),
            categories: [
                "moneta 512 B",
                "kernel 512 B",
                "moneta 4 KiB",
                "kernel 4 KiB",
            ]
            .map(String::from)
            .to_vec(),
            groups: vec![
                ("lookup".to_string(), vec![40.0, 120.0, 40.0, 130.0]),
                ("permission check".to_string(), vec![55.0, 0.0, 55.0, 0.0]),
                ("copy".to_string(), vec![60.0, 80.0, 600.0, 650.0]),
                ("channel".to_string(), vec![380.0, f64::NAN, 380.0]),
                ("system call".to_string(), vec![-3.0, 300.0, 0.0, 310.0]),
            ],
            stacked: true,
        };
        let path = dir.0.join("breakdown.png");
        check_png(render_bars(&b, &path), &path);
        b.stacked = false;
        let path = dir.0.join("grouped.png");
        check_png(render_bars(&b, &path), &path);
    }

    #[test]
    fn nothing_to_draw_still_renders() {
        let dir = TempDir::new("empty");
        let c = Chart {
            title: "Nothing".to_string(),
            x_label: "x".to_string(),
            y_label: "y".to_string(),
            x_scale: Scale::Log2,
            y_scale: Scale::Linear,
            series: vec![Series {
                label: "bad".to_string(),
                points: vec![(0.0, 1.0), (f64::NAN, 2.0), (4.0, f64::INFINITY)],
                dashed: false,
            }],
            y_from_zero: false,
        };
        let path = dir.0.join("chart.png");
        check_png(render_chart(&c, &path), &path);
        let b = BarChart {
            title: "Nothing".to_string(),
            y_label: "y".to_string(),
            categories: vec![],
            groups: vec![],
            stacked: true,
        };
        let path = dir.0.join("bars.png");
        check_png(render_bars(&b, &path), &path);
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(format_bytes(512.0), "512");
        assert_eq!(format_bytes(1024.0), "1K");
        assert_eq!(format_bytes(1536.0), "1.5K");
        assert_eq!(format_bytes(4096.0), "4K");
        assert_eq!(format_bytes(65536.0), "64K");
        assert_eq!(format_bytes(1048576.0), "1M");
        assert_eq!(format_bytes(4194304.0), "4M");
        assert_eq!(format_bytes(3.0 * 1024f64.powi(3)), "3G");
        assert_eq!(format_bytes(0.5), "0.5");
        assert_eq!(format_bytes(0.0), "0");
        assert_eq!(format_bytes(-2048.0), "-2K");
        assert_eq!(format_bytes(f64::NAN), "NaN");
    }

    #[test]
    fn si_numbers() {
        assert_eq!(format_si(1.0), "1");
        assert_eq!(format_si(1000.0), "1k");
        assert_eq!(format_si(12_500.0), "12.5k");
        assert_eq!(format_si(2e6), "2M");
        assert_eq!(format_si(0.25), "0.25");
        assert_eq!(format_si(0.0), "0");
        assert_eq!(format_si(-3e9), "-3G");
    }

    #[test]
    fn log2_axis_labels_sizes() {
        let values: Vec<f64> = sizes().iter().map(|s| s.log2()).collect();
        let axis = Axis::fit(Scale::Log2, &values, false);
        let labels: Vec<String> = axis.ticks.iter().map(|&t| axis.label(t)).collect();
        assert_eq!(labels.first().map(String::as_str), Some("512"));
        assert_eq!(labels.last().map(String::as_str), Some("4M"));
        for want in ["4K", "64K", "1M"] {
            assert!(
                labels.iter().any(|l| l == want),
                "{want} missing from {labels:?}"
            );
        }
        assert!(axis.ticks.len() <= MAX_TICKS);
        // A wider range keeps to MAX_TICKS labels by skipping powers.
        let axis = Axis::fit(Scale::Log2, &[0.0, 40.0], false);
        assert!(axis.ticks.len() <= MAX_TICKS, "{:?}", axis.ticks);
        assert!(axis.ticks.len() >= 5);
    }

    #[test]
    fn linear_axis_from_zero() {
        let axis = Axis::fit(Scale::Linear, &[420.0, 1730.0], true);
        assert_eq!(axis.lo, 0.0);
        assert!(axis.hi >= 1730.0);
        assert_eq!(axis.ticks.first().copied(), Some(0.0));
        assert!(
            axis.ticks.len() >= 4 && axis.ticks.len() <= 12,
            "{:?}",
            axis.ticks
        );
        assert_eq!(axis.label(500.0), "500");
        // A single value still gets a range around it.
        let axis = Axis::fit(Scale::Linear, &[3.0], false);
        assert!(axis.lo < 3.0 && axis.hi > 3.0);
        // A narrow decade on a log10 axis gets labels at 2 and 5.
        let axis = Axis::fit(Scale::Log10, &[200f64.log10(), 800f64.log10()], false);
        let labels: Vec<String> = axis.ticks.iter().map(|&t| axis.label(t)).collect();
        assert!(labels.iter().any(|l| l == "500"), "{labels:?}");
    }

    #[test]
    fn the_font_is_built_in_unless_one_is_named() {
        assert!(load_font(None).unwrap().contains("DejaVu"));
        let dir = TempDir::new("fonts");
        let bogus = dir.0.join("Some.ttf");
        std::fs::write(&bogus, b"x").expect("write");
        // A named file that is not a font is refused, naming the variable in the message.
        let err = load_font(Some(bogus.into_os_string())).expect_err("not a font");
        assert!(err.contains("Some.ttf"), "{err}");
        assert!(PlotError::NoFont(err).to_string().contains(FONT_ENV));
    }
}
