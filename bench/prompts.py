"""Prompt sets of the end-to-end benchmark (``bench/bench_end_to_end.py``).

The model is SmolLM2-135M-Instruct, a chat model: every prompt is one user turn in
its chat template (ChatML, as stored in the GGUF's ``tokenizer.chat_template``)::

    <|im_start|>system
    You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
    <|im_start|>user
    ...<|im_end|>
    <|im_start|>assistant

(the system line is the template's default; ``<|im_start|>`` and ``<|im_end|>``
are the special tokens 1 and 2, and the GGUF adds no BOS token).

Two sets:

* :data:`INPUT_GROUNDED`: tasks whose answer copies long spans of the prompt
  (edit a function, reformat a table, quote a passage, repeat a structure, extend a
  list).  This is where prompt lookup can win.
* :data:`OPEN_ENDED`: stories, explanations and advice, with nothing to copy.

A 135M model follows instructions loosely, so each grounded prompt was checked
with greedy decoding (``python bench/bench_end_to_end.py --show-outputs`` prints
each greedy answer and the share of its tokens that continue a 3-gram of the prompt)
to make sure its answer really reuses the input; the comments beside the prompts say
what the greedy answer does.
"""

from __future__ import annotations

__all__ = [
    "INPUT_GROUNDED",
    "OPEN_ENDED",
    "PROMPT_SETS",
    "SYSTEM",
    "TUNING_SETS",
    "chat",
    "ngram_training_texts",
]

#: The template's default system message (used when a conversation has none).
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat(user: str, system: str = SYSTEM) -> str:
    """One user turn in SmolLM2's chat template, ready for the assistant's answer.

    Parameters
    ----------
    user : str
        The user's message.
    system : str, optional
        The system message (default: the template's own).

    Returns
    -------
    str
        The prompt text; tokenise it with special tokens parsed and no BOS added.
    """
    return (
        f"<|im_start|>system\n{system}<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n"
        f"<|im_start|>assistant\n"
    )


_FUNCTION = """\
def average_word_length(text):
    words = text.split()
    count = 0
    total = 0
    for word in words:
        clean = word.strip(".,!?;:")
        if clean:
            total += len(clean)
            count += 1
    if count == 0:
        return 0.0
    result = total / count
    print("average:", result)
    return result
"""

_CSV = """\
name,country,population,area_km2
Tokyo,Japan,37400000,2194
Delhi,India,31000000,1484
Shanghai,China,27100000,6341
Sao Paulo,Brazil,22000000,1521
Mexico City,Mexico,21800000,1485
Cairo,Egypt,21300000,3085
"""

_PASSAGE = """\
The lighthouse at Carrow Point was built in 1852 from granite quarried on the \
island itself. Its lamp was first lit with whale oil, then with paraffin, and \
finally, in 1931, with electricity.

For ninety years the keepers lived in the small cottage at the foot of the tower. \
They wound the clockwork that turned the lens every four hours, cleaned the glass \
each morning, and wrote the weather in a logbook that is now kept in the town museum.

Today the light is automatic and the cottage is a cafe. Visitors can climb the \
one hundred and twelve steps to the gallery on Saturdays from May to September."""

_LIST = """\
- Apple: a crisp red fruit that grows on trees and tastes sweet.
- Banana: a long yellow fruit that grows in bunches and tastes soft and sweet.
- Cherry: a small red fruit that grows on trees and tastes sweet or sour.
- Grape: a small green or purple fruit that grows on vines and tastes juicy.
"""

_JSON = """\
{"name": "Alice Smith", "age": 34, "city": "Boston", "email": "alice.smith@example.com"}
{"name": "Bob Jones", "age": 28, "city": "Denver", "email": "bob.jones@example.com"}
"""

_EMAIL = """\
Dear team, thank you for all the hard work this month. The new website is now \
live and the first reviews from customers are very positive. Next week we will \
start working on the mobile app. Please send me your ideas before Friday so \
that we can plan the first sprint together. Best regards, Maria"""

#: Prompts whose answers copy spans of the prompt (name -> chat prompt text).
INPUT_GROUNDED: dict[str, str] = {
    # Asked to rename a variable, the model rewrites the function from scratch
    # (three lines, different); asked to "repeat this code, but rename", it copies it
    # (without the rename, and without the print line), then adds a sentence.
    "edit_function": chat(
        "```python\n" + _FUNCTION + "```\nRepeat this code, but rename the variable "
        "`count` to `n_words`."
    ),
    # Comma-separated input makes it answer in HTML; with " | " separators it writes a
    # Markdown table (header rule added, cells copied; " | " splits into other tokens
    # next to the cells, so only about 60% of its 3-grams are the prompt's).
    "table_to_markdown": chat(
        "Format this data as a table with columns separated by |:\n\n" + _CSV.replace(",", " | ")
    ),
    # Quotes the whole text, not the second paragraph: 99% of 3-grams are the prompt's.
    "quote_passage": chat(
        "Here is a text:\n\n" + _PASSAGE + "\n\nQuote the second paragraph of the text "
        "exactly, word for word."
    ),
    # Copies the email with the name replaced, then praises it (about half the answer).
    "repeat_email": chat(
        "Here is an email:\n\n" + _EMAIL + "\n\nRepeat the email exactly, "
        "but replace the name Maria with Daniel."
    ),
    # Repeats the four items (mixing their words), then repeats them again.
    "extend_list": chat(
        "Continue this list with six more fruits, in exactly the same style:\n\n" + _LIST
    ),
    # Reformats the records over several lines and repeats its own first record:
    # it reuses its own output more than the prompt (37% of 3-grams are the prompt's).
    "json_records": chat(
        "Here are two JSON records:\n\n" + _JSON + "\nWrite four more records in exactly "
        "the same format, for Carol White, Dan Brown, Eve Black and Frank Green."
    ),
}

#: Prompts with nothing to copy (name -> chat prompt text).
OPEN_ENDED: dict[str, str] = {
    "story_dragon": chat("Write a short story about a young dragon who is afraid of flying."),
    "explain_rain": chat("Explain to a ten-year-old how rain forms."),
    "advice_sleep": chat("Give me some advice on how to sleep better."),
    "explain_internet": chat("How does the internet work? Explain it simply."),
    "story_robot": chat("Tell me a story about a robot who learns to cook."),
    "advice_interview": chat("What should I do to prepare for a job interview?"),
}

_SQL = """\
SELECT customers.name, orders.total
FROM customers
JOIN orders ON orders.customer_id = customers.id
WHERE orders.total > 100
ORDER BY orders.total DESC;
"""

_CLASS = """\
class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, word):
        self.counts[word] = self.counts.get(word, 0) + 1

    def most_common(self):
        return max(self.counts, key=self.counts.get)
"""

_RECIPE = """\
1. Preheat the oven to 180 degrees.
2. Mix the flour, the sugar and the butter in a large bowl.
3. Add two eggs and stir until the dough is smooth.
4. Pour the dough into a round tin and bake for forty minutes.
5. Let the cake cool before you cut it.
"""

_NOTICE = """\
The library will be closed on Monday for maintenance of the heating system. \
Books that are due on Monday can be returned on Tuesday without a late fee. \
The reading room on the first floor will open again on Wednesday morning. \
We are sorry for the inconvenience and thank you for your patience."""

#: A second, held-out pair of sets (same kinds of task, other texts) for tuning
#: drafting policies offline (``bench/replay_drafting.py``): a policy tuned on these is
#: judged on :data:`PROMPT_SETS`, which it never saw.
TUNING_SETS: dict[str, dict[str, str]] = {
    "tuning-grounded": {
        "repeat_sql": chat("```sql\n" + _SQL + "```\nRepeat this query exactly."),
        "edit_class": chat(
            "```python\n" + _CLASS + "```\nRepeat this class, and add a method `total` "
            "that returns the sum of the counts."
        ),
        "copy_recipe": chat(
            "Here is a recipe:\n\n" + _RECIPE + "\nWrite the recipe again, step by step."
        ),
        "quote_notice": chat(
            "Here is a notice:\n\n" + _NOTICE + "\n\nQuote the notice exactly, word for word."
        ),
        "csv_to_json": chat(
            "Convert this data to a JSON list of objects:\n\n" + _CSV.split("Sao")[0]
        ),
        "list_more": chat(
            "Continue this list with five more animals, in exactly the same style:\n\n"
            "- Cat: a small furry animal that lives with people and likes to sleep.\n"
            "- Dog: a loyal animal that lives with people and likes to play.\n"
            "- Horse: a large strong animal that lives on farms and likes to run.\n"
        ),
    },
    "tuning-open": {
        "poem_sea": chat("Write a short poem about the sea at night."),
        "explain_seasons": chat("Why do we have seasons? Explain it simply."),
        "advice_study": chat("How can I study better for my exams?"),
        "story_cat": chat("Tell me a story about a cat who finds a secret door."),
        "explain_bread": chat("How is bread made? Explain the steps."),
        "advice_garden": chat("What should I plant in a small garden in spring?"),
    },
}

PROMPT_SETS: dict[str, dict[str, str]] = {
    "input-grounded": INPUT_GROUNDED,
    "open-ended": OPEN_ENDED,
}


def ngram_training_texts() -> list[str]:
    """Texts the token n-gram drafter is trained on: none of the evaluation answers.

    The Python language reference's help topics (``pydoc_data.topics``, about
    460,000 characters of English prose and Python code), which ship with every
    CPython.  The drafter sees no evaluation prompt and no model output before a
    run; during a run it also learns online from that run's prompt and kept tokens,
    as it would in use.

    Returns
    -------
    list of str
        One document per help topic.
    """
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]
