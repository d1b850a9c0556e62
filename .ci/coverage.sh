# The coverage gate, sourced by .ci/run and .ci/gates. What is measured: pyproject.toml's
# [tool.coverage.run] (branch coverage of the protocol and the session core: the session, its
# generation, relay and connection, the error boundary), only while their own tests,
# COVERAGE_TESTS, run.

# Per cent of the gated modules' lines and branches, together, with room for the hypothesis
# tests' run-to-run variation (the commit that sets it gives the figures).
COVERAGE_FLOOR=94
COVERAGE_TESTS=(tests/protocol tests/sessions)
# The pytest options that measure it into .coverage.
# -p msgpack: imported before coverage starts. Coverage finds a measured module by importing its
# parent packages and then drops them from sys.modules (engine/__init__ pulls in msgpack), and
# msgpack's C extension would go on raising the first import's exception classes: ExtraData
# would then escape codec.py's ``except msgpack.ExtraData`` as a generic decoding failure. A C
# extension such as numpy's refuses a second load outright, so none may be imported there.
# --coverage-only-in (tests/conftest.py): coverage pauses for the tests outside those folders, so
# that a run of the whole suite measures what a run of COVERAGE_TESTS alone does.
COVERAGE_OPTIONS=(-p msgpack --cov --cov-report= "${COVERAGE_TESTS[@]/#/--coverage-only-in=}")
