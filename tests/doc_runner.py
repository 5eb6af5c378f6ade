"""Run docs python blocks one after another in this one interpreter (imports paid once).

Reads a script path per line on stdin; runs it as ``__main__`` with fresh globals, so a
block sees nothing another defined; answers one JSON line per script on stdout:
``{"ok": bool, "stdout": str, "error": str}``. Started by ``doc_blocks.Run``.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
import traceback


def main() -> None:
    answers = sys.stdout
    for line in sys.stdin:
        captured = io.StringIO()
        ok, error = True, ""
        try:
            with contextlib.redirect_stdout(captured):
                runpy.run_path(line.strip(), run_name="__main__")
        except BaseException:  # noqa: BLE001 - a block's failure, reported to the test
            ok, error = False, traceback.format_exc()
        answers.write(json.dumps({"ok": ok, "stdout": captured.getvalue(), "error": error}))
        answers.write("\n")
        answers.flush()


if __name__ == "__main__":
    main()
