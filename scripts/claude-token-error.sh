#!/usr/bin/env bash
# How far foldgate's token counts of Claude conversations are from a Claude tokenizer's,
# uncalibrated and calibrated per model and per conversation, on recorded conversations
# (see examples/claude_token_error.rs for the method, docs/COMPACTION.md for results).
#
#   scripts/claude-token-error.sh                  # the dev traces
#   TRACES=path/to/other.jsonl scripts/claude-token-error.sh
#
# Needs node and npm: the tokenizer Anthropic published (@anthropic-ai/tokenizer) is
# installed under target/claude-tokenizer, and first counts sample texts itself so that
# the Rust port of its counting is checked against it before anything is measured.
set -euo pipefail
cd "$(dirname "$0")/.."
traces=${TRACES:-../shared/traces/dev.jsonl}
dir=target/claude-tokenizer
package=$dir/node_modules/@anthropic-ai/tokenizer
if [[ ! -f $package/claude.json ]]; then
  npm install --prefix "$dir" --no-save --no-audit --no-fund --silent @anthropic-ai/tokenizer@0.0.4
fi

# Reference counts by the package itself: every 40th message text of the traces (at most
# 400), and texts that exercise normalisation and non-Latin scripts.
node - "$traces" "$dir/checks.json" <<'JS'
const fs = require('fs');
const path = require('path');
const { countTokens } = require(path.resolve('target/claude-tokenizer/node_modules/@anthropic-ai/tokenizer'));
const [traces, out] = process.argv.slice(2);
const texts = ['ﬁle ① ｆｕｌｌｗｉｄｔｈ', '日本語のテキストと English', 'fn main() {\n    println!("hi");\n}\n', '  \t\n\n  x'];
let n = 0;
for (const line of fs.readFileSync(traces, 'utf8').split('\n')) {
  if (!line) continue;
  for (const m of JSON.parse(line).messages) {
    const text = typeof m.content === 'string' ? m.content
      : Array.isArray(m.content) ? m.content.map((p) => p.text || '').join('') : '';
    if (text && n++ % 40 === 0 && texts.length < 404) texts.push(text);
  }
}
fs.writeFileSync(out, JSON.stringify(texts.map((text) => ({ text, tokens: countTokens(text) }))));
JS

cargo run --quiet --release --example claude_token_error -- \
  "$package/claude.json" "$traces" "$dir/checks.json"
