"""Third-person notes (docs/design.md §4.8): grammatical, or the user's own words quoted."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from activememory.recall.third_person import third_person

NOTES = [
    # be, have and the contractions
    ("I am vegetarian", "The user is vegetarian"),
    ("I'm allergic to peanuts", "The user is allergic to peanuts"),
    ("I’m into jazz", "The user is into jazz"),
    ("I'm not a morning person", "The user is not a morning person"),
    ("I've been to Japan twice", "The user has been to Japan twice"),
    ("I’ve got two cats", "The user has got two cats"),
    ("I'd like a window seat", "The user would like a window seat"),
    ("I'd rather take the train", "The user would rather take the train"),
    ("I'd need a visa", "The user would need a visa"),
    ("I'd never been to Lisbon before", "The user had never been to Lisbon before"),
    ("I'll be in Berlin in May", "The user will be in Berlin in May"),
    ("I was born in Porto", "The user was born in Porto"),
    ("I have two kids", "The user has two kids"),
    ("I haven't been to Asia", "The user hasn't been to Asia"),
    # agreement of a present-tense verb; modals and past tenses unchanged
    ("I live in Lisbon", "The user lives in Lisbon"),
    ("I go climbing on Saturdays", "The user goes climbing on Saturdays"),
    ("I do yoga every morning", "The user does yoga every morning"),
    ("I don't eat meat", "The user doesn't eat meat"),
    ("I don’t eat meat", "The user doesn’t eat meat"),
    ("I do not drink coffee", "The user does not drink coffee"),
    ("I need a quiet room", "The user needs a quiet room"),
    ("I study French on Tuesdays", "The user studies French on Tuesdays"),
    ("I play chess", "The user plays chess"),
    ("I miss my old flat", "The user misses their old flat"),
    ("i love sushi", "The user loves sushi"),
    ("I can't stand cilantro", "The user can't stand cilantro"),
    ("I should sleep more", "The user should sleep more"),
    ("I will never fly again", "The user will never fly again"),
    ("I used to smoke", "The user used to smoke"),
    ("I grew up in Iowa", "The user grew up in Iowa"),
    ("I agreed to help", "The user agreed to help"),
    ("I moved to the US in 2019", "The user moved to the US in 2019"),
    ("I read every night before bed", "The user reads every night before bed"),
    ("I read it last year", "The user read it last year"),
    # adverbs between the subject and its verb; two verbs
    ("I really really like sushi", "The user really really likes sushi"),
    ("I personally prefer tea", "The user personally prefers tea"),
    ("I kind of like jazz", "The user kind of likes jazz"),
    ("I now live in Porto", "The user now lives in Porto"),
    ("I cook and clean on Sundays", "The user cooks and cleans on Sundays"),
    ("I am and always will be a Porto fan", "The user is and always will be a Porto fan"),
    # compound subjects take the plural verb; "or"/"nor" agree with the nearest
    (
        "My wife and I are celebrating our tenth anniversary",
        "The user's wife and the user are celebrating their tenth anniversary",
    ),
    (
        "Last summer my family and I went camping",
        "Last summer the user's family and the user went camping",
    ),
    (
        "My wife and I go hiking every weekend",
        "The user's wife and the user go hiking every weekend",
    ),
    (
        "Sarah and I have been friends since school",
        "Sarah and the user have been friends since school",
    ),
    ("I and my brother share a flat", "The user and their brother share a flat"),
    ("Me and my sister are twins", "The user and their sister are twins"),
    ("My husband and I said we would come", "The user's husband and the user said they would come"),
    ("Neither my wife nor I eat meat", "Neither the user's wife nor the user eats meat"),
    ("She cooks and I clean", "She cooks and the user cleans"),
    ("I work late and I am tired", "The user works late and the user is tired"),
    # the subject later in the sentence, objects and possessives
    ("Every Sunday I call my mother", "Every Sunday the user calls their mother"),
    ("Tea is what I drink every morning", "Tea is what the user drinks every morning"),
    ("My wife is taller than I am", "The user's wife is taller than the user is"),
    ("So do I", "So does the user"),
    ("Hey! I'm Caroline.", "Hey! The user is Caroline."),
    ("My sister calls me on Mondays", "The user's sister calls them on Mondays"),
    ("Tom gave me his old bike", "Tom gave the user his old bike"),
    ("That bike is mine", "That bike is the user's"),
    ("It's mine.", "It's the user's."),
    ("Tom and me went fishing", "Tom and the user went fishing"),
    ("I taught myself to code", "The user taught themselves to code"),
    ("My uncle worked in a gold mine", "The user's uncle worked in a gold mine"),
    ("I have type I diabetes", "The user has type I diabetes"),
    # someone else's words in quotes are kept as they are
    ('My sister always says "I love you"', 'The user\'s sister always says "I love you"'),
    ('She said "I am done"', 'Noted: She said "I am done"'),
    # where the grammar is not certain, the user's own words
    ("We moved to Porto last year", 'The user said: "We moved to Porto last year"'),
    ("Our dog is called Pixel", 'The user said: "Our dog is called Pixel"'),
    ("I read before bed", 'The user said: "I read before bed"'),
    ("I hurt my back", 'The user said: "I hurt my back"'),
    ("I wanna learn Spanish", 'The user said: "I wanna learn Spanish"'),
    ("I was, and still am, a fan", 'The user said: "I was, and still am, a fan"'),
    ("I, for one, love rain", 'The user said: "I, for one, love rain"'),
    ("My wife cooks and I clean", 'The user said: "My wife cooks and I clean"'),
    ("Do I need a visa for Japan?", 'The user asked: "Do I need a visa for Japan?"'),
    ("Where did I park my car?", 'The user asked: "Where did I park my car?"'),
]


@pytest.mark.parametrize(("text", "note"), NOTES)
def test_first_person_becomes_a_grammatical_third_person_note(text: str, note: str) -> None:
    assert third_person(text) == note


def test_the_table_is_large_and_has_no_duplicates() -> None:
    texts = [text for text, _ in NOTES]
    assert len(texts) >= 40
    assert len(set(texts)) == len(texts)


def test_no_table_note_has_a_broken_form() -> None:
    broken = re.compile(r"\bares\b|\bthe user am\b|(?<!and )\bthe user (?:are|were)\b", re.I)
    for _, note in NOTES:
        assert broken.search(note) is None, note


# --- Properties ------------------------------------------------------------------------------

# (plural subject's verb, "I"'s verb, the user's verb)
VERBS = [
    ("are", "am", "is"),
    ("have", "have", "has"),
    ("like", "like", "likes"),
    ("go", "go", "goes"),
    ("do", "do", "does"),
    ("don't eat", "don't eat", "doesn't eat"),
    ("watch", "watch", "watches"),
    ("study", "study", "studies"),
    ("play", "play", "plays"),
    ("need", "need", "needs"),
    ("miss", "miss", "misses"),
    ("fly", "fly", "flies"),
    ("went", "went", "went"),
    ("grew", "grew", "grew"),
    ("booked", "booked", "booked"),
    ("can", "can", "can"),
    ("will", "will", "will"),
]
# (sentence subject, the note's subject, singular)
SUBJECTS = [
    ("I", "The user", True),
    ("My wife and I", "The user's wife and the user", False),
    ("Sarah and I", "Sarah and the user", False),
    ("Every Sunday my brother and I", "Every Sunday the user's brother and the user", False),
    ("Me and my sister", "The user and their sister", False),
]
ADVERBS = ["", "always ", "really ", "personally ", "kind of ", "no longer "]
# (tail, the note's tail): what is not the user is never changed
TAILS = [
    (" tea", " tea"),
    (" in Iowa", " in Iowa"),
    (" near a gold mine", " near a gold mine"),
    (" in the US", " in the US"),
    (" my old flat", " their old flat"),
    (" type I tea", " type I tea"),
]
QUOTED_TEXT = st.text(alphabet="abIi'm ,.?", max_size=20).map(lambda s: f'"{s}"')


@given(
    subject=st.sampled_from(SUBJECTS),
    adverb=st.sampled_from(ADVERBS),
    verb=st.sampled_from(VERBS),
    tail=st.sampled_from(TAILS),
    quoted=st.none() | QUOTED_TEXT,
)
def test_the_verb_agrees_with_the_subject_and_the_rest_is_kept(
    subject: tuple[str, str, bool],
    adverb: str,
    verb: tuple[str, str, str],
    tail: tuple[str, str],
    quoted: str | None,
) -> None:
    said, noted, singular = subject
    plural_verb, first, third = verb
    ending = f" and Tom says {quoted}" if quoted else ""
    text = f"{said} {adverb}{first if singular else plural_verb}{tail[0]}{ending}"
    note = f"{noted} {adverb}{third if singular else plural_verb}{tail[1]}{ending}"
    assert third_person(text) == " ".join(note.split())


FIRST_PERSON = re.compile(r"\b(?:I|my|me|myself|we|us|our|ours|ourselves)\b", re.IGNORECASE)
QUOTED = re.compile(r'"[^"]*"')
WORDS = [
    "I",
    "I'm",
    "I’ve",
    "I'd",
    "I'll",
    "my",
    "me",
    "mine",
    "myself",
    "we",
    "we're",
    "us",
    "our",
    "ours",
    "and",
    "or",
    "nor",
    "but",
    "so",
    "am",
    "are",
    "is",
    "was",
    "were",
    "have",
    "has",
    "do",
    "don't",
    "did",
    "can",
    "will",
    "like",
    "go",
    "watch",
    "study",
    "read",
    "put",
    "the",
    "a",
    "tea",
    "Iowa",
    "Tom",
    "she",
    "it",
    "always",
    "really",
    "not",
    "kind",
    "of",
    "last",
    "every",
    ",",
    ".",
    "?",
    "-",
]


@given(words=st.lists(st.sampled_from(WORDS) | QUOTED_TEXT, max_size=12))
def test_every_first_person_word_is_rewritten_or_the_sentence_quoted(words: list[str]) -> None:
    text = " ".join(" ".join(words).split())  # a note is one line: spaces collapse
    note = third_person(text)
    assert "\n" not in note
    for span in QUOTED.findall(text):
        assert span in note
    for form in ("The user said: ", "The user asked: "):
        if note.startswith(form):
            assert note == f'{form}"{text}"'
            return
    rest = QUOTED.sub("", note)
    assert re.search(r"\bares\b|\bthe user am\b", rest, re.IGNORECASE) is None, note
    if note.startswith("Noted: "):
        rest = QUOTED.sub("", text)
    assert FIRST_PERSON.search(rest) is None, note
