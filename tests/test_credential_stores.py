"""Files that are credential stores by what they hold, not by their name
(adversarial round 3): a token in a git remote URL (`https://user:ghp_...@`,
`https://oauth2:glpat-...@`) or an `http.extraheader` in `.git/config`,
`~/.gitconfig`; the file `credential.helper = store --file F` names, and
git's XDG store; an `env` block holding API keys in Claude Code's
`~/.claude/settings.json` or the workspace's `.claude/settings.local.json`.
A blocked run that reads one gives back no byte of its output, as for any
credential. git reading its own configuration, as every git command does,
is not a credential read unless the command names the file or asks git to
print its configuration; a value that then reaches the output is found
there and seals it all the same. Real runs, root and rootless."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from caper.transaction import run
from helpers.rootless import NOBODY, need_rootless_venv, run_as_nobody
from helpers.trees import git_project

GH = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
GL = "glpat-" + "Zy9Xw8Vu7Ts6Rq5Po4Nm"
BASIC = base64.b64encode(b"x-access-token:hunter2-Plain-Secret").decode()
PLAIN = "plainServiceTokenValue-71c3"      # no token shape: found by its key


def _repo(tmp_path: Path, url: str) -> Path:
    ws = git_project(tmp_path / "ws", {"README": "hi\n"})
    subprocess.run(["git", "-C", str(ws), "remote", "add", "origin", url], check=True)
    return ws


def _go(command: str, ws: Path, home: Path, approver: str = "block", task: str | None = None):
    return run(command, cwd=str(ws), workspace=str(ws), approver=approver, task=task,
               env={**os.environ, "HOME": str(home)}, state_dir=str(home.parent / "state"))


def _sealed(out, *secrets: str) -> None:
    """The agent's view of the run (sealed: a constant) holds no form of the
    secrets; the approver's full report holds none verbatim."""
    sealed = out.report.sealed()
    doc = sealed.to_json() + sealed.card()
    assert not any(s in out.report.card() for s in secrets)
    assert out.withheld and out.stdout.head == out.stdout.tail == b"", out.stdout.text()
    for s in secrets:
        for form in (s, base64.b64encode(s.encode()).decode()[:16], s[::-1]):
            assert form not in doc


@pytest.mark.parametrize("url, token", [
    (f"https://user:{GH}@github.com/o/r.git", GH),
    (f"https://oauth2:{GL}@gitlab.example.com/o/r.git", GL)])
def test_a_token_in_a_remote_url_is_a_credential(tmp_path, url, token):
    home = tmp_path / "home"
    home.mkdir()
    ws = _repo(tmp_path, url)
    out = _go("base64 -w0 .git/config; rev .git/config", ws, home)
    assert "git-config-token" in out.report.read_credentials, out.report.card()
    _sealed(out, token)
    # asking git to print it is reading it
    out = _go("git remote get-url origin | base64 -w0; git config --list | rev", ws, home)
    assert "git-config-token" in out.report.read_credentials
    _sealed(out, token)
    # git copying the file into its object store by name, then printing the object encoded
    out = _go("git cat-file -p $(git hash-object -w .git/config) | base64 -w0", ws, home)
    assert "git-config-token" in out.report.read_credentials
    _sealed(out, token)


def test_git_reading_its_own_configuration_is_no_credential_read(tmp_path):
    """`git status`, `git log`, `git diff` read .git/config on every call: the
    run is judged as any other, its output given back when blocked."""
    home = tmp_path / "home"
    home.mkdir()
    ws = _repo(tmp_path, f"https://user:{GH}@github.com/o/r.git")
    out = _go("git status --short; git log --oneline; git diff; git branch -a", ws, home,
              approver="policy")
    assert out.report.read_credentials == [] and not out.withheld, out.report.card()
    assert out.committed, out.reason
    # the value in the output (git diff --no-index of the file) is still found
    out = _go("git diff --no-index /dev/null .git/config", ws, home)
    assert out.withheld and GH not in out.report.card()


# git takes the config for a commit template; the message file goes, and
# `fold -w1` prints the message one character a line, past any redaction.
COMMIT = ("export GIT_AUTHOR_NAME=a GIT_AUTHOR_EMAIL=b GIT_COMMITTER_NAME=a GIT_COMMITTER_EMAIL=b; "
          "{env} GIT_EDITOR=true git {opt} commit -q --allow-empty --allow-empty-message "
          "--cleanup=verbatim; rm .git/COMMIT_EDITMSG; git log -1 --format=%B | fold -w1")


@pytest.mark.parametrize("env, opt", [
    ("", "-c commit.template=t"),
    ("GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=commit.template GIT_CONFIG_VALUE_0=.git/config", "")])
def test_git_told_to_read_its_configuration_as_data_reads_a_credential(tmp_path, env, opt):
    """git configured by `-c`, or by GIT_CONFIG_* in its environment (which
    its command line does not show: the tracer looks at the environment's
    names at each exec), to read the config as data: that read is a
    credential read, and the blocked run gives nothing back."""
    home = tmp_path / "home"
    home.mkdir()
    ws = _repo(tmp_path, f"https://user:{GH}@github.com/o/r.git")
    (ws / "t").symlink_to(".git/config")
    out = _go(COMMIT.format(env=env, opt=opt), ws, home)
    assert "git-config-token" in out.report.read_credentials, out.report.card()
    _sealed(out, GH)


def test_an_extraheader_and_a_store_file_are_credentials(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    store = home / "my-creds"
    store.write_text(f"https://user:{PLAIN}@git.example.com\n")
    (home / ".gitconfig").write_text(
        f'[http "https://git.example.com/"]\n\textraheader = Authorization: Basic {BASIC}\n'
        f'[credential]\n\thelper = store --file {store}\n')
    xdg = home / ".config" / "git"
    xdg.mkdir(parents=True)
    (xdg / "credentials").write_text(f"https://u:{PLAIN}x@host.example\n")
    ws = git_project(tmp_path / "ws", {"README": "hi\n"})
    for name, secret, kind in ((home / ".gitconfig", BASIC, "git-config-token"),
                               (store, PLAIN, "git-credentials"),
                               (xdg / "credentials", PLAIN + "x", "git-credentials")):
        out = _go(f"rev {name}; base64 -w0 {name}", ws, home)
        assert kind in out.report.read_credentials, (name, out.report.card())
        _sealed(out, secret)


def test_an_agents_settings_with_keys_in_env_are_credentials(tmp_path):
    home = tmp_path / "home"
    (home / ".claude").mkdir(parents=True)
    (home / ".claude" / "settings.json").write_text(json.dumps(
        {"env": {"ANTHROPIC_API_KEY": "sk-ant-" + "k" * 30}, "permissions": {"allow": []}}))
    ws = git_project(tmp_path / "ws", {"README": "hi\n"})
    (ws / ".claude").mkdir()
    (ws / ".claude" / "settings.local.json").write_text(json.dumps(
        {"env": {"MY_SERVICE_TOKEN": PLAIN, "DEBUG": "1"}}))
    for name, secret in ((home / ".claude" / "settings.json", "sk-ant-" + "k" * 30),
                         (ws / ".claude" / "settings.local.json", PLAIN)):
        out = _go(f"rev {name}", ws, home)
        assert "agent-settings-env" in out.report.read_credentials, out.report.card()
        _sealed(out, secret)
    # settings holding no key are no credential: a blocked run's output comes back
    (ws / ".claude" / "settings.local.json").write_text(json.dumps({"env": {"DEBUG": "1"}}))
    out = _go("cat .claude/settings.local.json", ws, home)
    assert out.report.read_credentials == [] and b"DEBUG" in out.stdout.text()


def test_a_token_in_a_remote_url_is_a_credential_rootless():
    need_rootless_venv()
    base = tempfile.mkdtemp(prefix="caper-stores-")
    try:
        os.chmod(base, 0o755)
        ws, state = Path(base, "ws"), Path(base, "state")
        git_project(ws, {"README": "hi\n"})
        subprocess.run(["git", "-C", str(ws), "remote", "add", "origin",
                        f"https://user:{GH}@github.com/o/r.git"], check=True)
        state.mkdir()
        subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(ws), str(state)], check=True)
        out = run_as_nobody(ws, "cat .git/config", "block", state)
        # Nothing: the read was recognised as a credential's (else `cat` shows it).
        assert GH not in json.dumps(out) and out["stdout"] == "", out
        out = run_as_nobody(ws, "git status --short; echo done", "block", state)
        assert "done" in out["stdout"], out
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_credential_in_the_history_is_read_by_what_prints_the_history(tmp_path):
    """Round 5: a .env committed once and untracked since lives on in
    .git/objects; `git log -p --all | rev` opened only packs and objects, so
    no credential was read and the key came back reversed. git printing
    content from history, or another program reading the object store,
    reads every credential location the history holds."""
    ws = tmp_path / "ws"
    git_project(ws, {"README": "hi\n", ".env": f"API_TOKEN={GH}\n"})
    subprocess.run(["git", "-C", str(ws), "rm", "-q", "--cached", ".env"], check=True)
    (ws / ".gitignore").write_text(".env\n")
    subprocess.run(["git", "-C", str(ws), "add", ".gitignore"], check=True)
    subprocess.run(["git", "-C", str(ws), "-c", "user.email=a@b", "-c", "user.name=a", "commit",
                    "-qm", "untrack .env"], check=True)
    (ws / ".env").unlink()
    for command in ("git log -p --all | rev", "cat .git/objects/*/* | rev >/dev/null"):
        out = run(command, cwd=str(ws), workspace=str(ws), approver="policy",
                  state_dir=str(tmp_path / "state"), env={**os.environ, "HOME": str(tmp_path)})
        assert "dotenv" in out.report.read_credentials, (command, out.report.card())
        assert not out.committed and out.withheld and GH[::-1] not in out.card()
    out = run("git log --oneline", cwd=str(ws), workspace=str(ws), approver="policy",
              state_dir=str(tmp_path / "state"), env={**os.environ, "HOME": str(tmp_path)})
    assert out.report.read_credentials == [] and out.committed, out.reason


KEY_FILES = {
    "deploy/privkey.pem": "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIGq0pvd1FAKEFAKEFAKE\n"
                          "-----END PRIVATE KEY-----\n",
    "vpn/wg0.conf": "[Interface]\nPrivateKey = yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=\n",
    "k8s/admin.conf": "users:\n- user:\n    client-key-data: LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0t\n",
    "backup/shadow.old": "root:$6$saltsalt$Q0k1uA2y4Vf8fakehashfakehashfakehash:19000:0:99999:7:::\n",
    "keys/me.asc": "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBGVfakefakefake\n"
                   "-----END PGP PRIVATE KEY BLOCK-----\n",
}


@pytest.mark.parametrize("rel", sorted(KEY_FILES))
def test_a_key_under_a_name_no_pattern_knows_is_a_credential_by_what_it_holds(tmp_path, rel):
    """Round 5: privkey.pem, a WireGuard config, a kubeconfig outside ~/.kube
    and a copy of /etc/shadow were read back reversed by a blocked run: no
    pattern named them. Every file a run reads is looked at for a private
    key or password hashes (up to 4,000 files of 256 KiB)."""
    ws = tmp_path / "ws"
    (ws / rel).parent.mkdir(parents=True)
    (ws / rel).write_text(KEY_FILES[rel])
    (ws / "notes.txt").write_text("just notes\n")
    out = run(f"rev {rel}", cwd=str(ws), workspace=str(ws), approver="policy",
              state_dir=str(tmp_path / "state"), env={**os.environ, "HOME": str(tmp_path)})
    assert out.report.read_credentials, out.report.card()
    assert not out.committed and out.withheld and out.stdout.total == 0
    out = run("rev notes.txt", cwd=str(ws), workspace=str(ws), approver="policy",
              state_dir=str(tmp_path / "state"), env={**os.environ, "HOME": str(tmp_path)})
    assert out.report.read_credentials == [] and out.committed


@pytest.mark.parametrize("rel, text, kind", [
    # named since round 7 (the credential stop at connect time knows names only)
    (".config/stripe/config.toml", 'secret_key = "sk_test_4eC39HqLyjWDarjtT1zdp7dc"\n',
     "stripe-key"),
    (".wakatime.cfg", "[settings]\napi_key = waka_0b8f4e3c-1234-4a5b-9c7d-abcdefabcdef\n",
     "secret-setting"),
    (".config/pip/pip.conf", "[global]\nindex-url = https://me:s3cretpass@pypi.corp/simple\n",
     "secret-setting"),
])
def test_a_settings_file_with_a_secret_is_a_credential_by_what_it_holds(tmp_path, rel, text,
                                                                          kind):
    """Round 5: tools' settings files no pattern names (stripe, wakatime, a
    pip.conf with a password in its URL) were returned reversed by a blocked
    run. A settings file (outside the workspace, or config-shaped in it) with
    a secret-named key's value or a URL password is a credential by content;
    the workspace's code is not judged so (a `TOKEN_URL = ...` in a .py)."""
    home, ws = tmp_path / "home", tmp_path / "ws"
    (home / rel).parent.mkdir(parents=True)
    (home / rel).write_text(text)
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "settings.py").write_text('TOKEN_URL = "https://example.com/oauth/token"\n')
    env = {**os.environ, "HOME": str(home)}
    out = run(f"rev ~/{rel}", cwd=str(ws), workspace=str(ws), approver="policy",
              state_dir=str(tmp_path / "state"), env=env)
    assert kind in out.report.read_credentials, out.report.card()
    assert not out.committed and out.withheld
    out = run("rev src/settings.py", cwd=str(ws), workspace=str(ws), approver="policy",
              state_dir=str(tmp_path / "state"), env=env)
    assert out.report.read_credentials == [] and out.committed, out.reason


def test_a_library_that_holds_pem_markers_as_text_is_no_credential(tmp_path):
    """libssl and Python's _ssl module hold "-----BEGIN PRIVATE KEY-----" as
    strings: a binary file is not judged by content (every Python program
    that imports ssl read one as a "credential" until this was seen)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "libfake.so").write_bytes(b"\x7fELF\0\0\0" + b"-----BEGIN PRIVATE KEY-----\n" * 3)
    out = run("cat libfake.so >/dev/null", cwd=str(ws), workspace=str(ws), approver="policy",
              state_dir=str(tmp_path / "state"), env={**os.environ, "HOME": str(tmp_path)})
    assert out.report.read_credentials == [] and out.committed, out.reason


def test_the_systems_tls_settings_are_no_credential(tmp_path):
    """openssl.cnf's `private_key = $dir/private/cakey.pem` names a path: a
    TLS client reading it (every Python, node, curl) read no credential."""
    ws = tmp_path / "ws"
    ws.mkdir()
    out = run("python3 -c 'import ssl; ssl.create_default_context(); print(1)'", cwd=str(ws),
              workspace=str(ws), approver="policy", state_dir=str(tmp_path / "state"),
              env={**os.environ, "HOME": str(tmp_path)})
    assert out.report.read_credentials == [] and out.committed, out.reason


def test_a_token_in_a_submodules_config_is_a_credential(tmp_path):
    """Round 5: actions/checkout writes its auth header into each
    submodule's .git/modules/<name>/config; only the top repository's
    config was looked at, and `rev` of the submodule's returned the token."""
    home = tmp_path / "home"
    home.mkdir()
    ws = _repo(tmp_path, "https://github.com/o/r.git")
    sub = ws / ".git" / "modules" / "lib"
    sub.mkdir(parents=True)
    (sub / "config").write_text(f"[remote \"origin\"]\n\turl = https://x:{GH}@github.com/o/lib\n")
    out = _go("rev .git/modules/lib/config", ws, home)
    assert "git-config-token" in out.report.read_credentials, out.report.card()
    _sealed(out, GH)


def test_git_told_to_trace_its_configuration_reads_a_credential(tmp_path):
    """Round 5: GIT_TRACE2_CONFIG_PARAMS='remote.*' made `git status` print
    the remote URL, token and all, while git's own read of its config did
    not count as a credential read. A git whose environment names GIT_TRACE*
    or GIT_CURL_VERBOSE is not reading its config only for itself."""
    home = tmp_path / "home"
    home.mkdir()
    ws = _repo(tmp_path, f"https://user:{GH}@github.com/o/r.git")
    out = _go("GIT_TRACE2=1 GIT_TRACE2_CONFIG_PARAMS='remote.*' git status 2>&1 | rev", ws, home)
    assert "git-config-token" in out.report.read_credentials, out.report.card()
    _sealed(out, GH)
