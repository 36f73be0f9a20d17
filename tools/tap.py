"""tap.py - the report of the checkers in tools/ (check_k8s.py, deploy_checks.py):
one line per check, "ok - NAME" or "not ok - NAME: DETAIL" (the detail only
on failure), and a closing count "LABEL: N passed, N failed" that
tests/run.sh and CI read."""
import sys


class Report:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, cond, detail=""):
        """Print one check; returns cond."""
        if cond:
            self.passed += 1
            print(f"ok - {name}", flush=True)
        else:
            self.failed += 1
            print(f"not ok - {name}" + (f": {detail}" if detail else ""), flush=True)
        return cond

    def close(self, label):
        """Print the count; the exit status to return (1 on any failure)."""
        print(f"{label}: {self.passed} passed, {self.failed} failed", flush=True)
        sys.stdout.flush()
        return 1 if self.failed else 0
