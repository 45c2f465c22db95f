"""The rows of the RNN estimator tests, the same as
`tests/support/fixtures/record_tf_rnn.py` gives TensorFlow: reviews of 0 to 4
words (one out of the vocabulary) with a rating a word, an age and a city a
review, a 0/1 label, a word label and a float64 weight; `step_rows`: a label and a
weight at each word."""
import numpy as np

VOCABULARY = ["good", "bad", "fine", "meh"]
LABELS = ["low", "mid", "high"]


def rows(n, seed):
    """(features, binary labels, word labels) as lists and arrays."""
    rng = np.random.default_rng(seed)
    words, stars = [], []
    for _ in range(n):
        count = int(rng.integers(0, 5))
        words.append([str(w) for w in rng.choice(VOCABULARY + ["zzz"], count)])
        stars.append([float(v) for v in np.round(rng.uniform(0, 2, count), 3)])
    age = np.round(rng.uniform(20, 60, (n, 1)), 1).astype(np.float32)
    city = rng.choice(["paris", "quito"], (n, 1))
    w = np.linspace(0.5, 2.0, n)
    binary = np.array([int("good" in r and ("bad" not in r or r.index("good") < r.index("bad")))
                       for r in words], np.int64)
    score = np.array([sum(s) for s in stars])
    kind = np.array(LABELS)[np.digitize(score, [1.0, 3.0])]
    return {"words": words, "stars": stars, "age": age, "city": city, "w": w}, binary, kind


def batches(data, size):
    """(features, labels) batches of `size` rows (the last holds the rest)."""
    features, labels = data
    n = len(labels)
    return [({k: v[i:i + size] for k, v in features.items()}, labels[i:i + size])
            for i in range(0, n, size)]


def step_rows(n, seed):
    """`rows` with a label at each word (TF's `return_sequences=True`): 0/1
    (the word is "good") and a word label (its rating's third: "low" below
    0.7, "high" from 1.4), and a weight at each word (its rating plus 0.5)."""
    features, _, _ = rows(n, seed)
    binary = [[int(w == "good") for w in words] for words in features["words"]]
    kind = [[LABELS[int(np.digitize(s, [0.7, 1.4]))] for s in stars]
            for stars in features["stars"]]
    weights = [[s + 0.5 for s in stars] for stars in features["stars"]]
    return {**features, "w": weights}, binary, kind
