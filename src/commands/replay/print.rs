//! The replay's report, as text (one line per conversation, the summary, the per-family
//! table and the cost) or as JSON.

use std::collections::BTreeMap;

use serde_json::Value;

use super::ReplayStats;

/// One conversation's line (or the total's): requests (compacted), peak prompt in and out,
/// share of prompt tokens sent, folds, requests by tier and violations by guarantee.
fn line(s: &ReplayStats) -> String {
    let tiers: Vec<String> = s.tiers.iter().map(|(t, n)| format!("t{t}:{n}")).collect();
    let viol: Vec<String> = s.violations.iter().map(|(c, n)| format!("({c}):{n}")).collect();
    format!(
        "{:<52} {:>5} {:>5} {:>8} {:>8} {:>6.1}% {:>5}  {:<24} {}",
        s.id,
        s.requests,
        s.compacted,
        s.peak_before,
        s.peak_after,
        s.ratio() * 100.0,
        s.folds,
        tiers.join(" "),
        if viol.is_empty() { "0".to_owned() } else { viol.join(" ") }
    )
}

/// One family's line: its conversations, requests (compacted), peak prompt in and out,
/// share of prompt tokens sent, requests by tier, cost against no compaction, prefix
/// repeats, summarizer calls and small user messages lost.
fn family_line(s: &ReplayStats, price: f64) -> String {
    let tiers: Vec<String> = s.tiers.iter().map(|(t, n)| format!("t{t}:{n}")).collect();
    let (cost, whole) = (s.cost(price), s.cost_whole(price));
    format!(
        "{:<16} {:>5} {:>6} {:>6} {:>8} {:>8} {:>6.1}%  {:<30} {:>7.2}M {:>7.2}M {:>6.3}x \
         {:>7.1}% {:>6} {:>5}",
        s.id,
        s.conversations,
        s.requests,
        s.compacted,
        s.peak_before,
        s.peak_after,
        s.ratio() * 100.0,
        tiers.join(" "),
        cost / 1e6,
        whole / 1e6,
        if whole > 0.0 { cost / whole } else { 1.0 },
        100.0 * s.prefix_repeats as f64 / s.requests.max(1) as f64,
        s.summarizer_calls,
        s.user_words_lost,
    )
}

/// The per-family table: one line per family under a header, then the total.
pub fn family_table(all: &[ReplayStats], total: &ReplayStats, price: f64) -> String {
    let mut out = format!(
        "{:<16} {:>5} {:>6} {:>6} {:>8} {:>8} {:>7}  {:<30} {:>8} {:>8} {:>7} {:>8} {:>6} {:>5}\n",
        "family",
        "convs",
        "reqs",
        "comp",
        "peak_in",
        "peak_out",
        "sent",
        "requests by tier",
        "cost",
        "whole",
        "ratio",
        "repeats",
        "calls",
        "lost"
    );
    for s in ReplayStats::by_family(all).values() {
        out.push_str(&family_line(s, price));
        out.push('\n');
    }
    out.push_str(&family_line(total, price));
    out
}

/// The cost summary: the replay's cost against sending every request whole, the share
/// of requests whose prefix repeats the previous one, and the summarizer's input.
pub fn cost_line(total: &ReplayStats, price: f64) -> String {
    let (cost, whole) = (total.cost(price), total.cost_whole(price));
    format!(
        "cost (uncached input x1, cached prefix x{price}): {:.2}M token-equivalents, \
         no compaction {:.2}M ({:.3}x); prefix repeats the previous request on {} of {} \
         requests ({:.1}%); summarizer: {} calls, {} input tokens ({} cached)",
        cost / 1e6,
        whole / 1e6,
        if whole > 0.0 { cost / whole } else { 1.0 },
        total.prefix_repeats,
        total.requests,
        100.0 * total.prefix_repeats as f64 / total.requests.max(1) as f64,
        total.summarizer_calls,
        total.summarizer.tokens(),
        total.summarizer.cached,
    )
}

/// Prints the report as one JSON object: every conversation's stats, each family's and
/// the total, with their cost at `price` per cached token.
#[allow(clippy::print_stdout)]
pub(super) fn json(all: &[ReplayStats], total: &ReplayStats, price: f64) {
    let families: BTreeMap<String, Value> = ReplayStats::by_family(all)
        .into_iter()
        .map(|(family, s)| {
            let priced = serde_json::json!({
                "stats": s,
                "cost": s.cost(price),
                "cost_no_compaction": s.cost_whole(price),
            });
            (family, priced)
        })
        .collect();
    let out = serde_json::json!({
        "conversations": all,
        "families": families,
        "total": total,
        "ratio": total.ratio(),
        "cached_price": price,
        "cost": total.cost(price),
        "cost_no_compaction": total.cost_whole(price),
    });
    println!("{out}");
}

/// Prints the report as text: a line per conversation and the total, the summary lines,
/// the per-family table, the hash of the forwarded bodies and the first of each loss.
pub(super) fn text(all: &[ReplayStats], total: &ReplayStats, price: f64) {
    conversation_lines(all, total);
    summary_lines(all.len(), total, price);
    family_section(all, total, price);
    first_losses(total);
}

/// Prints the header, one line per conversation and the total's line.
#[allow(clippy::print_stdout)]
fn conversation_lines(all: &[ReplayStats], total: &ReplayStats) {
    println!(
        "{:<52} {:>5} {:>5} {:>8} {:>8} {:>7} {:>5}  {:<24} violations",
        "conversation", "reqs", "comp", "peak_in", "peak_out", "sent", "folds", "tiers"
    );
    for s in all {
        println!("{}", line(s));
    }
    println!("{}", line(total));
}

/// Prints the violations by guarantee, the totals of the `conversations`, the cost, the
/// small user messages lost and the work trail's recall.
#[allow(clippy::print_stdout)]
fn summary_lines(conversations: usize, total: &ReplayStats, price: f64) {
    let count = |c: u8| total.violations.get(&c).copied().unwrap_or(0);
    println!(
        "checks: (1) tool calls answered: {} violations, (2) small user messages verbatim: {}, \
         (3) pinned unchanged: {}, (4) fits window - reserve: {}, (5) current turn intact: {}",
        count(1),
        count(2),
        count(3),
        count(4),
        count(5)
    );
    println!(
        "total: {} conversations, {} requests ({} compacted), peak {} -> {} tokens, \
         {:.1}% of prompt tokens sent, {} folds",
        conversations,
        total.requests,
        total.compacted,
        total.peak_before,
        total.peak_after,
        total.ratio() * 100.0,
        total.folds
    );
    println!("{}", cost_line(total, price));
    println!(
        "small user messages (the user's own words) not forwarded verbatim: {} in {} \
         requests",
        total.user_words_lost, total.requests_losing_user_words
    );
    println!(
        "work trail: {:.1}% of the file paths the agent named still named by compacted \
         requests ({} of {}); {} trail entries no action produced",
        total.path_recall() * 100.0,
        total.paths_kept,
        total.paths_named,
        total.trail_foreign
    );
}

/// Prints the per-family table under its legend, then the hash of the forwarded bodies.
#[allow(clippy::print_stdout)]
fn family_section(all: &[ReplayStats], total: &ReplayStats, price: f64) {
    println!(
        "\nper family (cost in token-equivalents, cached prefix x{price}; whole: no \
         compaction; repeats: requests whose prefix repeats the previous one; calls: \
         summarizer calls; lost: small user messages not forwarded verbatim):"
    );
    println!("{}", family_table(all, total, price));
    println!("forwarded bodies: sha256 {}", total.forwarded_sha256);
}

/// Prints the first violation, small user message lost, file path lost and foreign trail
/// entry, those there were.
#[allow(clippy::print_stdout)]
fn first_losses(total: &ReplayStats) {
    if let Some(v) = &total.first_violation {
        println!("first violation: {v}");
    }
    if let Some(v) = &total.first_user_words_lost {
        println!("first small user message lost: {v}");
    }
    if let Some(v) = &total.first_path_lost {
        println!("first file path lost: {v}");
    }
    if let Some(v) = &total.first_trail_foreign {
        println!("first trail entry no action produced: {v}");
    }
}
