"""The built-in teaching corpus: English -> German from a small grammar.

A deterministic generator, so `make demo` needs no download and no files. It
is honest about what it is: a toy with a few dozen words each of nouns,
verbs and adjectives, but with the parts of German that make translation
more than word-for-word substitution:

* gender and case: der/die/das, den/dem, ein/einen/einem, and adjective
  endings that depend on all three (ein großer Hund, den großen Hund);
* verb agreement: the dog sleeps / der Hund schläft, the dogs sleep /
  die Hunde schlafen;
* word order: a fronted time phrase moves the verb before the subject
  (Am Morgen sieht der Hund ...), "because" sends the verb to the end
  (..., weil die Katze den Ball sieht), "not" goes after the object;
* contractions: in dem -> im, an dem -> am.

Attention maps of a model trained on it show these reorderings clearly.
"""

import random

# Nouns: English singular, English plural, German singular, German plural, gender.
ANIMATE = [
    ("dog", "dogs", "Hund", "Hunde", "m"),
    ("man", "men", "Mann", "Männer", "m"),
    ("bird", "birds", "Vogel", "Vögel", "m"),
    ("cook", "cooks", "Koch", "Köche", "m"),
    ("doctor", "doctors", "Arzt", "Ärzte", "m"),
    ("woman", "women", "Frau", "Frauen", "f"),
    ("cat", "cats", "Katze", "Katzen", "f"),
    ("mouse", "mice", "Maus", "Mäuse", "f"),
    ("cow", "cows", "Kuh", "Kühe", "f"),
    ("child", "children", "Kind", "Kinder", "n"),
    ("girl", "girls", "Mädchen", "Mädchen", "n"),
    ("horse", "horses", "Pferd", "Pferde", "n"),
]
THINGS = [
    ("ball", "balls", "Ball", "Bälle", "m"),
    ("apple", "apples", "Apfel", "Äpfel", "m"),
    ("letter", "letters", "Brief", "Briefe", "m"),
    ("cake", "cakes", "Kuchen", "Kuchen", "m"),
    ("flower", "flowers", "Blume", "Blumen", "f"),
    ("newspaper", "newspapers", "Zeitung", "Zeitungen", "f"),
    ("book", "books", "Buch", "Bücher", "n"),
    ("car", "cars", "Auto", "Autos", "n"),
    ("bicycle", "bicycles", "Fahrrad", "Fahrräder", "n"),
    ("picture", "pictures", "Bild", "Bilder", "n"),
]
PLACES = [
    ("park", "Park", "m"),
    ("garden", "Garten", "m"),
    ("lake", "See", "m"),
    ("tree", "Baum", "m"),
    ("kitchen", "Küche", "f"),
    ("street", "Straße", "f"),
    ("bridge", "Brücke", "f"),
    ("house", "Haus", "n"),
]
# English, German stem.
ADJECTIVES = [
    ("big", "groß"),
    ("small", "klein"),
    ("old", "alt"),
    ("young", "jung"),
    ("red", "rot"),
    ("black", "schwarz"),
    ("white", "weiß"),
    ("new", "neu"),
    ("tired", "müde"),
    ("happy", "glücklich"),
]
# English 3rd singular, English plural, German 3rd singular, German 3rd plural.
TRANSITIVE = [
    ("sees", "see", "sieht", "sehen"),
    ("finds", "find", "findet", "finden"),
    ("carries", "carry", "trägt", "tragen"),
    ("buys", "buy", "kauft", "kaufen"),
    ("paints", "paint", "malt", "malen"),
    ("holds", "hold", "hält", "halten"),
    ("watches", "watch", "beobachtet", "beobachten"),
]
INTRANSITIVE = [
    ("sleeps", "sleep", "schläft", "schlafen"),
    ("runs", "run", "läuft", "laufen"),
    ("laughs", "laugh", "lacht", "lachen"),
    ("waits", "wait", "wartet", "warten"),
    ("sings", "sing", "singt", "singen"),
    ("plays", "play", "spielt", "spielen"),
]
# English preposition, German preposition, German contraction with dem (if any).
PREPOSITIONS = [
    ("in", "in", "im"),
    ("at", "an", "am"),
    ("on", "auf", None),
    ("behind", "hinter", None),
    ("under", "unter", None),
    ("next to", "neben", None),
]
TIMES = [
    ("today", "heute"),
    ("now", "jetzt"),
    ("in the morning", "am Morgen"),
    ("in the evening", "am Abend"),
    ("on Sunday", "am Sonntag"),
]

DEFINITE = {
    "nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
    "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
    "dat": {"m": "dem", "f": "der", "n": "dem"},
}
INDEFINITE = {
    "nom": {"m": "ein", "f": "eine", "n": "ein"},
    "acc": {"m": "einen", "f": "eine", "n": "ein"},
    "dat": {"m": "einem", "f": "einer", "n": "einem"},
}
# Adjective endings by article kind ("def", "indef", "none"), case and gender/plural.
ENDINGS = {
    "def": {"nom": {"m": "e", "f": "e", "n": "e", "pl": "en"}, "acc": {"m": "en", "f": "e", "n": "e", "pl": "en"}, "dat": {"m": "en", "f": "en", "n": "en"}},
    "indef": {"nom": {"m": "er", "f": "e", "n": "es"}, "acc": {"m": "en", "f": "e", "n": "es"}, "dat": {"m": "en", "f": "en", "n": "en"}},
    "none": {"nom": {"pl": "e"}, "acc": {"pl": "e"}},
}


def _decline(stem, ending):
    """groß + er -> großer; müde + e -> müde (no doubled e)."""
    if stem.endswith("e") and ending.startswith("e"):
        return stem + ending[1:]
    return stem + ending


def _english_article(article, next_word):
    if article == "a" and next_word[0] in "aeiou":
        return "an"
    return article


class _Phrase:
    """A noun phrase in both languages, declined for one case."""

    def __init__(self, rng, nouns, case, allow_plural=True, allow_indefinite=True):
        english_sg, english_pl, german_sg, german_pl, gender = rng.choice(nouns)
        self.plural = allow_plural and rng.random() < 0.3
        kind = "def" if rng.random() < 0.6 or not allow_indefinite else ("none" if self.plural else "indef")
        adjective = rng.choice(ADJECTIVES) if rng.random() < 0.4 else None
        key = "pl" if self.plural else gender
        noun_en, noun_de = (english_pl, german_pl) if self.plural else (english_sg, german_sg)

        english_words = [adjective[0]] if adjective else []
        english_words.append(noun_en)
        if kind == "def":
            english_words.insert(0, "the")
        elif kind == "indef":
            english_words.insert(0, _english_article("a", english_words[0]))

        german_words = [_decline(adjective[1], ENDINGS[kind][case][key])] if adjective else []
        german_words.append(noun_de)
        if kind == "def":
            german_words.insert(0, DEFINITE[case][key])
        elif kind == "indef":
            german_words.insert(0, INDEFINITE[case][key])
        self.english = english_words
        self.german = german_words
        self.definite_singular_masculine_or_neuter = kind == "def" and key in ("m", "n")


def _prepositional_phrase(rng):
    english_prep, german_prep, contraction = rng.choice(PREPOSITIONS)
    place_en, place_de, gender = rng.choice(PLACES)
    phrase = _Phrase(rng, [(place_en, place_en, place_de, place_de, gender)], "dat", allow_plural=False)
    german = list(phrase.german)
    if contraction and phrase.definite_singular_masculine_or_neuter:
        german[0] = contraction  # in dem -> im, an dem -> am
    else:
        german.insert(0, german_prep)
    return [english_prep] + phrase.english, german


def _clause(rng, subordinate=False):
    """One clause as (English words, German words in main-clause order, German verb-final order)."""
    subject = _Phrase(rng, ANIMATE, "nom")
    transitive = rng.random() < 0.6
    verb = rng.choice(TRANSITIVE if transitive else INTRANSITIVE)
    english_verb = verb[1] if subject.plural else verb[0]
    german_verb = verb[3] if subject.plural else verb[2]
    negated = rng.random() < 0.15
    obj = _Phrase(rng, ANIMATE + THINGS, "acc") if transitive else None
    place = _prepositional_phrase(rng) if not negated and rng.random() < 0.5 else None

    english = list(subject.english)
    if negated:
        english += ["do" if subject.plural else "does", "not", verb[1]]
    else:
        english.append(english_verb)
    if obj:
        english += obj.english
    if place:
        english += place[0]

    middle = (obj.german if obj else []) + (["nicht"] if negated else []) + (place[1] if place else [])
    if subordinate:
        german = subject.german + middle + [german_verb]
    else:
        german = [german_verb] + middle  # the verb in second position; subject added by the caller
    return english, subject.german, german


def _capitalize(words):
    return [words[0][0].upper() + words[0][1:]] + words[1:]


def generate_pair(rng):
    """One (English, German) sentence pair."""
    english, german_subject, german_rest = _clause(rng)
    time = rng.choice(TIMES) if rng.random() < 0.3 else None
    if time:
        english = time[0].split() + english
        german = time[1].split() + german_rest[:1] + german_subject + german_rest[1:]  # V2: verb before subject
    else:
        german = german_subject + german_rest
    if rng.random() < 0.25:
        reason_english, _, reason_german = _clause(rng, subordinate=True)
        english = english + ["because"] + reason_english
        german = german + [",", "weil"] + reason_german
    english_text = " ".join(_capitalize(english)) + "."
    german_text = " ".join(_capitalize(german)).replace(" ,", ",") + "."
    return english_text, german_text


def demo_corpus(num_train=24000, num_val=1000, num_test=1000, seed=2017):
    """Distinct sentence pairs split into disjoint train/val/test lists of (en, de).

    The same seed always gives the same corpus.
    """
    rng = random.Random(seed)
    seen = set()
    pairs = []
    wanted = num_train + num_val + num_test
    attempts = 0
    while len(pairs) < wanted:
        attempts += 1
        if attempts > 50 * wanted:
            raise RuntimeError(f"the grammar produced only {len(pairs)} distinct pairs")
        pair = generate_pair(rng)
        if pair[0] not in seen:
            seen.add(pair[0])
            pairs.append(pair)
    return {
        "test": pairs[:num_test],
        "val": pairs[num_test : num_test + num_val],
        "train": pairs[num_test + num_val :],
    }
