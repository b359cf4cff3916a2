//! A reply's `<think>…</think>` reasoning split from its answer, as the reasoning parsers of
//! llama-server (`common_chat_parse` with `reasoning_format: deepseek`) and vLLM (`deepseek_r1`,
//! `qwen3`, `glm45`) split it for Qwen3, DeepSeek-R1 and GLM-4.5/4.6.
//!
//! The rule:
//! - The reasoning runs up to the first `</think>`. It starts after a `<think>` that opens the reply
//!   (leading whitespace before it allowed), or at the reply's first byte when the reply holds a
//!   `</think>` but no `<think>` before it: the template's generation prompt opened the block (it ends
//!   with `<think>\n`, as DeepSeek-R1's and Qwen3's thinking prompts do), so the model's first token
//!   is already inside it.
//! - The content is what follows that `</think>`, with its leading whitespace removed (templates
//!   write `</think>\n\n` before the answer). Later `<think>` text is content, untouched.
//! - A reply that opened a block and never closed it (generation stopped while thinking) is all
//!   reasoning and an empty content.
//! - A reply with no `</think>` and no opening `<think>` is all content; reasoning is `None`.
//! - The reasoning is trimmed of surrounding whitespace; empty reasoning (`<think>\n\n</think>`, what
//!   Qwen3 writes with thinking off) is `None`.

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Splits a model's reply into `(reasoning, content)` by the rule in this module's docs.
pub fn split_reasoning(text: &str) -> (Option<String>, String) {
    let trimmed = text.trim_start();
    let (inside, opened) = match trimmed.strip_prefix(OPEN) {
        Some(rest) => (rest, true),
        None => (text, false),
    };
    match inside.find(CLOSE) {
        Some(end) => {
            let reasoning = inside[..end].trim();
            let content = inside[end + CLOSE.len()..].trim_start();
            (non_empty(reasoning), content.to_string())
        }
        None if opened => (non_empty(inside.trim()), String::new()),
        None => (None, text.to_string()),
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::split_reasoning;

    fn split(s: &str) -> (Option<&'static str>, String) {
        let (r, c) = split_reasoning(s);
        (r.map(|r| &*Box::leak(r.into_boxed_str())), c)
    }

    #[test]
    fn a_closed_block_at_the_start_is_reasoning_and_the_rest_content() {
        assert_eq!(
            split("<think>\nLet me see.\n</think>\n\nParis."),
            (Some("Let me see."), "Paris.".to_string())
        );
    }

    #[test]
    fn a_reply_that_starts_inside_a_block_the_template_opened_counts_up_to_the_first_close() {
        assert_eq!(
            split("The user asks.\n</think>\n\nParis. </think> stays"),
            (Some("The user asks."), "Paris. </think> stays".to_string())
        );
    }

    #[test]
    fn an_unclosed_block_is_all_reasoning() {
        assert_eq!(
            split("<think>\nstill thinking"),
            (Some("still thinking"), String::new())
        );
    }

    #[test]
    fn no_tags_is_all_content_verbatim() {
        assert_eq!(split("  Paris.\n"), (None, "  Paris.\n".to_string()));
    }

    #[test]
    fn an_empty_block_is_no_reasoning() {
        assert_eq!(
            split("<think>\n\n</think>\n\nParis."),
            (None, "Paris.".to_string())
        );
    }

    #[test]
    fn a_think_tag_later_in_the_reply_is_content() {
        assert_eq!(
            split("Paris. Use <think> tags to think."),
            (None, "Paris. Use <think> tags to think.".to_string())
        );
    }
}
