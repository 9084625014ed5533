#!/usr/bin/python3
"""README.md names everything a user can set, call or scrape.

    IKBO_BUILD=build IKBO_ROOT=. /usr/bin/python3 tests/integration/test_readme.py

Why: the README is the server's manual ("every flag, endpoint, metric, op
and model"), and nothing else kept it in step: a flag added to a binary or
a key to the config table went undocumented unnoticed (ikbo-loadgen had nine
flags only its --help named). Each list here is read from the program
itself, never written out by hand, so a new name fails this test until the
README has it:
  1. flags: every --flag in the --help of ikbo-serve, ikbo-score, ikbo-plan,
     ikbo-loadgen, echo_server, host_path and tools/rank_client.py;
  2. config keys: the lists ikbo-serve gives in its "unknown key (known:
     ...)" refusals, at the top level and in each object section;
  3. metrics: every ikbo_* family the daemon exports (server/metrics.c's
     table is the one list);
  4. ops: the list the loader gives when it refuses an unknown op;
  5. HTTP routes: every path server/http.c routes;
  6. models: every model directory shipped in models/;
  7. environment: every IKBO_* variable the server, engine, kernels and
     tools read;
  8. the other way round: every file of the repository the README names
     (a path under one of its source folders) exists (a test renamed or
     moved left a README line pointing at nothing).
Runs the binaries only with --help or with bad input (no daemon stays up);
well under a second.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

from itest_run import check, run_tests, summary

ROOT = os.environ.get("IKBO_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("IKBO_BUILD", os.path.join(ROOT, "build"))
README = open(os.path.join(ROOT, "README.md")).read()


def missing(names, fmt="%s"):
    """The names README does not contain (as fmt renders them)."""
    return sorted(n for n in set(names) if fmt % n not in README)


def missing_words(names):
    """The names README does not contain as a whole word (a flag inside an
    example command counts; --model inside --model-version does not)."""
    return sorted(n for n in set(names)
                  if not re.search(r"(?<![\w-])%s(?![\w-])" % re.escape(n), README))


def run(args, timeout=20):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def test_flags():
    tools = [[os.path.join(BUILD, b)] for b in
             ["ikbo-serve", "ikbo-score", "ikbo-plan", "ikbo-loadgen", "echo_server", "host_path"]]
    tools.append([sys.executable, os.path.join(ROOT, "tools", "rank_client.py")])
    for t in tools:
        b = os.path.basename(t[-1])
        _, out = run(t + ["--help"])  # host_path has no --help: its usage line
        flags = re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", out)
        check(len(flags) >= 3, "%s --help lists no flags: %r" % (b, out[:200]))
        gone = missing_words(flags)
        check(not gone, "README.md does not document %s's %s" % (b, ", ".join(gone)))


def known_keys(config):
    """ikbo-serve's list of known keys when config has an unknown one."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(config, f)
        f.flush()
        rc, out = run([os.path.join(BUILD, "ikbo-serve"), "--config", f.name])
    m = re.search(r"unknown key \(known: ([^)]*)\)", out)
    check(rc == 2 and m, "config %s: expected an unknown-key refusal, got %d: %s" % (config, rc, out))
    return [k.strip() for k in m.group(1).split(",")]


def test_config_keys():
    top = known_keys({"no_such_key": 1})
    # A key as `key` or "key"; a section also through its keys (`limits.max_users`).
    gone = [k for k in top
            if "`%s`" % k not in README and '"%s"' % k not in README and "`%s." % k not in README]
    check(not gone, "README.md does not document config keys %s" % ", ".join(gone))
    sections = [s for s in ["limits", "log", "tls", "batching", "version_policy"] if s in top]
    check(len(sections) == 5, "config sections changed: %s" % top)
    for s in sections:
        keys = known_keys({s: {"no_such_key": 1}})
        # Documented as `section.key`, as `key` in the section's own table,
        # or as "key" in the section's example value.
        gone = [k for k in keys if "`%s.%s`" % (s, k) not in README and "`%s`" % k not in README
                and '"%s"' % k not in README]
        check(not gone, "README.md does not document %s keys %s" % (s, ", ".join(gone)))


def test_metrics():
    src = open(os.path.join(ROOT, "server", "metrics.c")).read()
    names = re.findall(r'"(ikbo_[a-z0-9_]+)"', src)
    check(len(names) >= 20, "found only %d metric names in server/metrics.c" % len(names))
    gone = missing(names, "`%s`")
    check(not gone, "README.md does not document metrics %s" % ", ".join(gone))


def test_ops():
    with tempfile.TemporaryDirectory(prefix="ikbo-readme-") as d:
        model = {"format": "ikbo-model/1",
                 "inputs": {"user": {"dense": 2}, "candidate": {"dense": 2}}, "tables": {},
                 "layers": [{"name": "x", "op": "no_such_op", "input": "user.dense"}],
                 "output": {"logits": "x", "tasks": ["a"]}}
        with open(os.path.join(d, "model.json"), "w") as f:
            json.dump(model, f)
        _, out = run([os.path.join(BUILD, "ikbo-plan"), d])
    m = re.search(r"unknown op 'no_such_op' \(ops: ([^)]*)\)", out)
    check(m, "ikbo-plan did not list the ops: %s" % out)
    ops = [o.strip() for o in m.group(1).split(",")]
    check(len(ops) >= 15, "only %d ops listed: %s" % (len(ops), ops))
    gone = missing(ops, "`%s`")
    check(not gone, "README.md does not document ops %s" % ", ".join(gone))


def test_http_routes():
    src = open(os.path.join(ROOT, "server", "http.c")).read()
    routes = [r for r in re.findall(r'"(/[a-z0-9_/{}:]+)"', src) if r not in ("/", "/v1/models/")]
    check(len(routes) >= 6, "found only %d routes in server/http.c" % len(routes))
    gone = missing(routes)
    check(not gone, "README.md does not document routes %s" % ", ".join(gone))


def test_env():
    names = set()
    for d in ["server", "engine", "kernels", "tools"]:
        for dirpath, _, files in os.walk(os.path.join(ROOT, d)):
            for f in files:
                if f.endswith((".c", ".cu", ".cuh", ".h")):
                    src = open(os.path.join(dirpath, f), errors="replace").read()
                    # a string that starts with a variable's name: getenv's
                    # argument, a key table's entry, or a message naming it
                    names.update(re.findall(r'"(IKBO_[A-Z0-9_]+)', src))
    check(len(names) >= 8, "found only %d IKBO_* variables" % len(names))
    gone = missing(names, "`%s")
    check(not gone, "README.md does not document environment variables %s" % ", ".join(gone))


def test_models():
    d = os.path.join(ROOT, "models")
    names = [n for n in os.listdir(d) if os.path.isdir(os.path.join(d, n))]
    check(len(names) >= 3, "models/ has %d models" % len(names))
    gone = missing(names, "models/%s")
    check(not gone, "README.md does not describe models/%s" % ", models/".join(gone))


# The tracked folders a README path may start with; build/ (made by make) is not one.
SOURCE_DIRS = ("bench", "config", "deploy", "engine", "kernels", "models", "proto", "server", "tests",
               "tools")


# Paths the README names that make writes (not committed), and the
# placeholder X (tests/fuzz/corpus/X: one folder a fuzz target).
GENERATED = {"models/bench/1"}


def readme_paths(text):
    """Repository paths (SOURCE_DIRS/...) the text names, less patterns
    (*, <...>, {...}), placeholders (a component X or *_X) and GENERATED."""
    found = re.findall(r"(?<![\w./-])((?:%s)/[\w./*<>{}-]*[\w*>}])" % "|".join(SOURCE_DIRS), text)
    return sorted({p for p in found if not re.search(r"[*<>{}]|(^|/|_)X(/|$)", p)} - GENERATED)


def test_paths():
    paths = readme_paths(README)
    check(len(paths) >= 30, "found only %d repository paths in README.md" % len(paths))
    gone = [p for p in paths if not os.path.exists(os.path.join(ROOT, p))]
    check(not gone, "README.md names files that do not exist: %s" % ", ".join(gone))
    # the check itself: a path that is not there is reported
    check(readme_paths("see `tests/unit/no_such_test.c`.") == ["tests/unit/no_such_test.c"],
          "readme_paths does not find a backticked path")


def main():
    tests = [test_flags, test_config_keys, test_env, test_metrics, test_ops, test_http_routes,
             test_models, test_paths]
    failed, t_all = run_tests(tests)
    sys.exit(summary(len(tests), failed, t_all))


if __name__ == "__main__":
    main()
