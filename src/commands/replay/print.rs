//! The replay's report: one line per conversation, the per-family table and the cost
//! summary.

use super::ReplayStats;

/// One conversation's line (or the total's): requests (compacted), peak prompt in and out,
/// share of prompt tokens sent, folds, requests by tier and violations by guarantee.
pub(super) fn line(s: &ReplayStats) -> String {
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
