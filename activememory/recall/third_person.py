"""Third-person notes from first-person evidence (docs/design.md §4.8).

`local/extractive` answers in the evidence's own words. A user's first-person sentence is
rewritten only where its grammar is certain ("I live in Porto" → "The user lives in Porto",
"My wife and I are …" → "The user's wife and the user are …"). Elsewhere the note quotes the
user (`The user said: "…"`), because a wrong verb form misleads more than a quotation:

- "we", "us", "our" without "X and I" before them: who "we" are is unknown, and "the user and
  their family" would invent it;
- a present verb after "X and I" where X is not plainly a name or "my wife": "My wife cooks
  and I clean" joins two clauses, "My wife and I clean" one plural subject;
- a verb whose past is spelt like its present ("I read") with no habit or past cue;
- "I" followed by a comma ("I, for one, …"), or a number.

A question is quoted as `The user asked: "…"`: it tells what the user wanted to know, not a
fact about them. Text inside double quotes is someone's own words and is never changed. Known
gap: a second verb after an object ("I cook dinner and clean up") keeps its first-person form.
"""

from __future__ import annotations

import re

from .._output import one_line

_SECOND_PERSON = re.compile(r"\b(?:you|your|yours|yourself|you're|you’re)\b", re.IGNORECASE)
_THIRD_PERSON_START = re.compile(r"^(?:the )?user(?:'s|’s)?\b", re.IGNORECASE)
_QUOTED = re.compile(r'"[^"]*"|“[^”]*”')  # someone's own words: never rewritten
_QUESTION = re.compile(r"\?[\s\"”’')]*$")
# A word (with inner apostrophes: "I'm", "don't"), a run of spaces, or one other character.
_TOKEN = re.compile(r"[^\W_]+(?:['’][^\W_]+)*|\s+|.")


def word_set(words: str) -> frozenset[str]:
    """The words of a whitespace-separated list (the tables here and in `local_model`)."""
    return frozenset(words.split())


def _pairs(words: str, forms: str) -> dict[str, str]:
    return dict(zip(words.split(), forms.split(), strict=True))


# What may stand between "I" and its verb ("I really like"); other "-ly" words too.
_ADVERBS = word_set(
    """
    always usually normally generally typically often sometimes never rarely really also still
    just only mostly actually absolutely definitely truly totally once first recently already
    finally even almost nearly occasionally frequently seldom hardly now then too ever no
    longer not kinda sorta
    """
)
_LY_VERBS = word_set("fly rely apply reply supply comply imply multiply ally bully rally tally")
_AGREES = _pairs("am have do don't haven't aren't", "is has does doesn't hasn't isn't")
_MODALS = word_set("can could will would shall should may might must ought")
_PAST = word_set(
    """
    was were had did got went ate bought brought came drank drove flew forgot found gave heard ran
    held kept knew left lost made met paid said saw sent sat slept spent stood swam thought took
    told understood woke wore won wrote began became broke chose caught fell felt fought hung hid
    rode rang rose sang sold shot stole struck taught threw grew built drew dug fed fled led lit
    meant bent lent sank shook sought spoke spun stuck swore swept swung tore bit blew bled dealt
    dreamt forgave froze knelt leapt learnt slid stank wept withdrew sped shone sprang been gone
    done seen known taken given eaten forgotten written driven flown grown shown thrown chosen
    spoken broken fallen ridden risen stolen begun drunk sung swum better spat strode shrank
    stung clung flung wound bound forbade overtook mistook
    """
)
# Present and past spelt alike: the tense comes from a habit or past cue, else it is unsure.
_SAME_PAST = word_set("read put cut hit let set shut quit hurt cost spread bet beat burst cast lay")
_PRESENT_ED = word_set("need feed bleed breed speed seed heed weed proceed succeed exceed embed")
# A habit: also what `local_model` counts as a preference cue.
HABIT_CUES = "always|usually|normally|generally|typically|often|never|daily|weekly|nightly"
_HABIT = re.compile(rf"\b(?:{HABIT_CUES}|sometimes|every|each|rarely|regularly)\b", re.IGNORECASE)
_PAST_CUE = re.compile(r"\b(?:yesterday|ago|last|once|earlier|previously)\b", re.IGNORECASE)
# "I" after these is a numeral ("type I diabetes", "World War I").
_NUMBERED = word_set("type part chapter phase level grade stage class act volume season book war")
_CLAUSE_BREAK = re.compile(r"[^\w\s'’]")
_GLUED = re.compile(r"[-/]|\.\w")  # "I-95", "I/O", "I.e."
# In an inversion ("so do I", "had I known") the auxiliary agrees and the verb stays.
_AUXILIARIES = _MODALS | word_set(
    """
    am do did have had was were don't didn't haven't hadn't can't couldn't won't wouldn't
    shouldn't wasn't weren't aren't
    """
)
_CONTRACTED = {"i'm": "am", "i've": "have", "i'd": "would", "i'll": "will"}
_ME = {  # first mention, later mentions
    "my": ("the user's", "their"),
    "mine": ("the user's", "theirs"),
    "myself": ("the user", "themselves"),
    "me": ("the user", "them"),
}
_WE = _pairs(  # after "X and I" only
    "we we're we've we'd we'll us our ours ourselves",
    "they they're they've they'd they'll them their theirs themselves",
)
_FIRST_PERSON = {"i", *_CONTRACTED, *_ME, *_WE}
# "mine" is a pronoun in "is mine", "mine is"; a noun in "a gold mine", "mine shafts".
_MINE_BEFORE = word_set("is was are were be been of and or than like it's that's")
_MINE_AFTER = word_set("is was are were has had too and or will would")
# Words that start a new subject, not a second verb, after "I cook and …".
_NOT_VERBS = word_set(
    """
    he she it they you the a an my his her its their this that these those everyone everybody
    everything nobody nothing someone somebody something each all both none most many few some
    """
)
_SUBJECTS = word_set("i i'm i've i'd i'll he she it they he's she's it's they're")
# "X and I" is one plural subject when X is a name or "my wife", maybe after a time phrase.
_NOUN_PHRASE = re.compile(
    r"(?:(?:every|each|on|at|in|this|last|next|then|now|so|also|usually|often|sometimes|"
    r"\w+days?|weekends?|mornings?|evenings?|nights?)\s+)*"
    r"(?:(?:both\s+)?(?:my|the|his|her|their)\s+(?:\w+|\w+\s+\w+(?<!s))(?:\s+(?-i:[A-Z])\w*)?"
    r"|(?-i:[A-Z])\w*(?:\s+(?-i:[A-Z])\w*)?)",
    re.IGNORECASE,
)


class _Unsure(Exception):
    """A construction this module cannot rewrite with certainty: the note quotes instead."""


def third_person(text: str, role: str | None = None) -> str:
    """The note for one piece of evidence, in its own words, on one line.

    A user's first-person sentence becomes third person where its grammar is certain ("I
    always take X" → "The user always takes X", "my" → "the user's", then "their"), else it
    is quoted (`The user said: "…"`; a question `The user asked: "…"`). Text already about
    "the user" is kept; anything else (an assistant turn, text addressing "you", a note)
    becomes "Noted: <text>".
    """
    text = one_line(text)
    unquoted = _QUOTED.sub("", text)
    if role == "assistant" or _SECOND_PERSON.search(unquoted):
        return f"Noted: {text}"
    if _THIRD_PERSON_START.match(text):
        return text[0].upper() + text[1:]
    try:
        note: str | None = _Rewrite(text).note()
    except _Unsure:
        note = None
    if note == text:
        return f"Noted: {text}"
    asked = _QUESTION.search(unquoted) is not None
    if note is None or asked:
        return f'The user {"asked" if asked else "said"}: "{text}"'
    return note[0].upper() + note[1:]


def _agree(verb: str, text: str) -> str:
    """A lower-case verb after a singular "the user": "have" → "has", "like" → "likes";
    modals and past tenses unchanged. `text` gives the tense of "read", "put", …"""
    if verb in _AGREES:
        return _AGREES[verb]
    if verb in _SAME_PAST:
        if _PAST_CUE.search(text):
            return verb
        if not _HABIT.search(text):
            raise _Unsure
    elif verb in _MODALS or _is_past(verb) or verb.endswith("n't"):
        return verb
    elif verb in ("are", "wanna", "gotta") or not verb.isalpha():
        raise _Unsure
    if verb.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if len(verb) > 1 and verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def _is_past(verb: str) -> bool:
    return verb in _PAST or (verb.endswith("ed") and verb not in _PRESENT_ED)


def _styled(original: str, form: str) -> str:
    """`form` with the capital and apostrophe of the word it replaces."""
    if "’" in original:
        form = form.replace("'", "’")
    if len(original) > 1 and original.isupper():
        return form.upper()
    return form[0].upper() + form[1:] if original[0].isupper() else form


class _Rewrite:
    """One left-to-right pass over a sentence's words outside double quotes."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = _TOKEN.findall(text)
        self.out = list(self.tokens)
        self.named = False  # "the user" is written: a later "my" is "their"
        self.plural = False  # "X and I" is written: "we", "our" are "they", "their"

    def note(self) -> str:
        quoted = False
        for i, token in enumerate(self.tokens):
            if token in ('"', "“", "”"):
                quoted = token == "“" or (token == '"' and not quoted)
            elif not quoted and token[0].isalnum():
                self._word(i, self._low(i))
        return "".join(self.out)

    def _low(self, i: int | None) -> str:
        return "" if i is None else self.tokens[i].replace("’", "'").lower()

    def _before(self, i: int) -> int | None:
        """The word just before token `i`, with only space between."""
        j = i - 1 - (i > 0 and self.tokens[i - 1].isspace())
        return j if j >= 0 and self.tokens[j][0].isalnum() else None

    def _after(self, i: int | None) -> int | None:
        """The word just after token `i`, with only space between."""
        if i is None:
            return None
        j = i + 1 + (i + 1 < len(self.tokens) and self.tokens[i + 1].isspace())
        return j if j < len(self.tokens) and self.tokens[j][0].isalnum() else None

    def _verb_after(self, i: int | None) -> int | None:
        """The first word after token `i` that is not an adverb ("I really like")."""
        j = self._after(i)
        while j is not None:
            word = self._low(j)
            if word in ("kind", "sort") and self._low(self._after(j)) == "of":
                j = self._after(j)
            elif word not in _ADVERBS and not (word.endswith("ly") and word not in _LY_VERBS):
                return j
            j = self._after(j)
        return None

    def _word(self, i: int, word: str) -> None:
        if word in ("i", *_CONTRACTED) and self._is_pronoun(i):
            self._subject(i, _CONTRACTED.get(word))
        elif word in _ME and (word != "mine" or self._is_pronoun(i)):
            first, later = _ME[word]
            again = self.named and not (word == "me" and self._low(self._before(i)) == "and")
            self.out[i] = _styled(self.tokens[i], later if again else first)
            self.named = True
            self.plural |= word == "me" and self._low(self._after(i)) == "and"
        elif word == "am" and self.out[i] == "am" and self._low(self._after(i)) != "i":
            if not self._low(self._before(i)).isdigit():  # "I was, and still am": far from "I"
                raise _Unsure
        elif word in _WE and self.tokens[i] != "US":
            if not self.plural:
                raise _Unsure
            self.out[i] = _styled(self.tokens[i], _WE[word])

    def _is_pronoun(self, i: int) -> bool:
        """Whether "I" is the user, not a numeral ("type I", "I-95"), and "mine" is theirs,
        not a pit ("a gold mine")."""
        before, after = self._low(self._before(i)), self._low(self._after(i))
        if self._low(i) == "mine":
            return (not before or before in _MINE_BEFORE) and (not after or after in _MINE_AFTER)
        glued = "".join(self.tokens[i + 1 : i + 3])
        return _GLUED.match(glued) is None and before not in _NUMBERED

    def _subject(self, i: int, contracted: str | None) -> None:
        """Rewrite "I" (or "I'm", …) at token `i` as "the user", and make its verb agree."""
        self.named = True
        j = i - 1 - (i > 0 and self.tokens[i - 1].isspace())
        user = "The user" if j >= 0 and self.tokens[j] in ".!?" else "the user"
        before = self._before(i)
        if contracted is None and self._low(before) in _AUXILIARIES:  # "so do I"
            assert before is not None
            form = _AGREES.get(self._low(before), self._low(before))
            self.out[before], self.out[i] = _styled(self.tokens[before], form), user
            return
        verb = None if contracted else self._verb_after(i)
        if contracted is None and verb is None:  # "taller than I": only the end may follow
            rest = "".join(self.tokens[i + 1 :]).strip()
            if rest[:1] not in ("", *'.!?;:)"”'):
                raise _Unsure
            self.out[i] = user
            return
        word = contracted or self._low(verb)
        if contracted == "would" and _is_past(self._low(self._verb_after(i))):
            word = "had"  # "I'd been" is "had been"; "I'd like" is "would like"
        if word in ("and", "or", "nor", "but", "to"):  # "I and my wife are"
            self.plural |= word == "and"
            self.out[i] = user
            return
        if word in _FIRST_PERSON or word[:1].isdigit():
            raise _Unsure
        plural = self._compound(before, word)
        form = word if plural else _agree(word, self.text)
        if verb is None:
            self.out[i] = f"{user} {form}"
            return
        self.out[i], self.out[verb] = user, _styled(self.tokens[verb], form)
        if not plural:
            self._second_verb(verb)

    def _second_verb(self, verb: int) -> None:
        """Make a verb right after "and" agree too ("I cook and clean"), unless it starts a
        new subject ("and Tom cleans", "and kids dance")."""
        joined = self._after(verb)
        if self._low(joined) not in ("and", "or") or (second := self._verb_after(joined)) is None:
            return
        word = self._low(second)
        plural_noun = word.endswith("s") and not word.endswith(("ss", "us"))
        new_subject = word in _FIRST_PERSON | _NOT_VERBS or self.tokens[second][0].isupper()
        if not new_subject and not plural_noun:
            self.out[second] = _styled(self.tokens[second], _agree(word, self.text))

    def _compound(self, before: int | None, verb: str) -> bool:
        """Whether "X and I" is one plural subject: "My wife and I are", not "…and I am"."""
        if self._low(before) != "and" or verb in ("am", "was", "wasn't"):
            return False
        assert before is not None
        words = _CLAUSE_BREAK.split("".join(self.tokens[:before]))[-1].split()
        if verb in ("are", "were", "aren't", "weren't") or _NOUN_PHRASE.fullmatch(" ".join(words)):
            self.plural = True
            return True
        said = {word.replace("’", "'").lower() for word in words}
        if len(words) > 1 and not said.isdisjoint(_SUBJECTS):  # "She cooks and I clean"
            return False
        if _agree(verb, self.text) == verb:  # "…and I went": the same either way
            return False
        raise _Unsure
