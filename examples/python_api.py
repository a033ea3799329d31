"""An agent loop that runs its shell commands through caper.Gate.

    python3 examples/python_api.py /path/to/a/git/project

Two steps a coding agent might take: the first writes a notes file (ordinary
work: committed), the second deletes the sources (not what the task asked:
blocked, nothing changed). The verdicts come from the offline approver.
"""
import sys

from caper import Gate


def main(project: str) -> int:
    gate = Gate(project)
    steps = [("make-notes", "echo 'todo: tests' > NOTES.md", "write a NOTES.md with our todo"),
             ("wipe-sources", "rm -rf src .git", "fix the typo in the README")]
    for name, command, task in steps:
        result = gate.run(command, task=task)
        if result.committed:
            print(f"allowed: {name} (exit {result.exit_code})")
        else:
            print(f"blocked: {name}: {result.reason}")
            print(result.report.card())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
