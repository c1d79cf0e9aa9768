import pytest

from swarmfactory.agents.edits import EditError, extract_source

PARENT = """#include <stdint.h>
void k(const float *x, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i];
}
"""


def test_a_fenced_rewrite_is_taken_whole():
    src, how = extract_source("Here:\n```c\n#include <stdint.h>\nvoid k(const float *x) {}\n```\nDone.", PARENT, "k")
    assert how == "rewrite" and src.startswith("#include") and "Done" not in src


def test_search_replace_edits_apply_in_order_even_with_other_indentation():
    answer = ("<<<<<<< SEARCH\n        y[i] = x[i];\n=======\n        y[i] = 2 * x[i];\n>>>>>>> REPLACE\n"
              "<<<<<<< SEARCH\nfor (int64_t i = 0; i < n; i++)\n=======\n    for (int64_t i = n - 1; i >= 0; i--)\n>>>>>>> REPLACE")
    src, how = extract_source(answer, PARENT, "k")
    assert how == "edit" and "2 * x[i]" in src and "i >= 0" in src


@pytest.mark.parametrize("answer, kind", [
    ("", "empty"),
    ("   \n", "empty"),
    ("I would use AVX-512 here.", "parse_error"),
    ("```python\nprint('k(')\n```", "parse_error"),
    ("<<<<<<< SEARCH\nnot in the parent\n=======\nx\n>>>>>>> REPLACE", "apply_error"),
])
def test_unusable_answers_are_typed(answer, kind):
    with pytest.raises(EditError) as err:
        extract_source(answer, PARENT, "k")
    assert err.value.kind == kind
