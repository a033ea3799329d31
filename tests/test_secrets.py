"""Credential locations and redaction: which paths are protected, which
values a credential file holds, and that each token shape is replaced."""
from __future__ import annotations

import os

import pytest

from caper.report.secrets import Protected, ProtectedPattern, Redactor, default_patterns, values_in

HOME = "/home/u"


@pytest.mark.parametrize("path, kind", [
    ("/w/.env", "dotenv"), ("/w/sub/.env.production", "dotenv"), ("/w/prod.env", "dotenv"),
    (f"{HOME}/.ssh/id_ed25519", "ssh-private-key"), (f"{HOME}/.ssh/id_rsa", "ssh-private-key"),
    (f"{HOME}/.aws/credentials", "aws-credentials"), (f"{HOME}/.netrc", "netrc"),
    (f"{HOME}/.config/gcloud/legacy_credentials/a/adc.json", "gcloud-credentials"),
    (f"{HOME}/.docker/config.json", "docker-credentials"), (f"{HOME}/.npmrc", "npm-token"),
    (f"{HOME}/.pypirc", "pypi-token"), (f"{HOME}/.local/share/keyrings/login.keyring", "keyring"),
    (f"{HOME}/.mozilla/firefox/x.default/logins.json", "browser-profile"),
    ("/etc/shadow", "system-credentials"),
    # the gated agents' own logins, and other tools' tokens (the adversarial round's list)
    (f"{HOME}/.claude/.credentials.json", "claude-code-login"),
    (f"{HOME}/.codex/auth.json", "codex-login"), (f"{HOME}/.gemini/oauth_creds.json", "gemini-login"),
    (f"{HOME}/.cargo/credentials.toml", "cargo-token"), (f"{HOME}/.pgpass", "postgres-password"),
    (f"{HOME}/.my.cnf", "mysql-password"), (f"{HOME}/.vault-token", "vault-token"),
    (f"{HOME}/.terraform.d/credentials.tfrc.json", "terraform-token"),
    (f"{HOME}/.gem/credentials", "rubygems-key"), (f"{HOME}/.m2/settings.xml", "maven-credentials"),
    (f"{HOME}/.config/hub", "github-token"),
    (f"{HOME}/.ssh/id_ed25519.pub", None), (f"{HOME}/.ssh/known_hosts", None),
    ("/etc/ssl/certs/ca-certificates.crt", None), ("/w/src/env.py", None),
    ("/w/.environment", None), ("/other/.aws/credentials", None),
    ("/w/deploy/id_rsa", "ssh-private-key"), ("/w/deploy/gcp-sa.json", "gcloud-credentials"),
    ("/w/ci/service-account-prod.json", "gcloud-credentials"), ("/w/deploy/id_rsa.pub", None),
    ("/w/.dev.vars", "dotenv"), ("/w/infra/prod.tfvars", "terraform-variables"),
    ("/w/terraform.tfstate", "terraform-state"), ("/w/token.json", "oauth-token"),
    ("/w/ios/AuthKey_ABC123.p8", "private-key"), ("/w/.htpasswd", "password-hashes"),
    ("/etc/shadow-", "system-credentials"), ("/etc/letsencrypt/live/x/privkey.pem", "private-key"),
    ("/run/secrets/db_password", "container-secrets"), ("/w/src/tokens.py", None),
])
def test_default_protected_locations(path, kind):
    assert Protected(default_patterns(), HOME, "/w").kind(path) == kind


def test_extra_patterns_relative_to_workspace_and_home():
    p = Protected([ProtectedPattern("deploy/**/*.json", "deploy"),
                   ProtectedPattern("~/.vault-token", "vault")], HOME, "/w")
    assert p.kind("/w/deploy/a/b/prod.json") == "deploy" and p.kind("/w/deploy/x.json") == "deploy"
    assert p.kind("/elsewhere/deploy/x.json") is None
    assert p.kind(f"{HOME}/.vault-token") == "vault"


def test_the_first_matching_pattern_names_the_kind():
    """The patterns are one alternation tried in order: defaults before the
    config's, so a config pattern cannot rename a default location."""
    a, b = ProtectedPattern("*.key", "any-key"), ProtectedPattern("deploy/*.key", "deploy-key")
    assert Protected([a, b], "/h", "/w").kind("/w/deploy/x.key") == "any-key"
    assert Protected([b, a], "/h", "/w").kind("/w/deploy/x.key") == "deploy-key"
    assert Protected([b, a], "/h", "/w").kind("/w/other/x.key") == "any-key"
    assert Protected([b], "/h", "/w").kind("/w/deploy/x.keys") is None
    assert Protected([], "/h", "/w").kind("/w/.env") is None


def test_values_of_credential_files():
    data = (b"# comment\n[default]\naws_access_key_id = AKIAIOSFODNN7EXAMPLE\n"
            b"export TOKEN=\"quoted-token-1\"\nDEBUG=1\nmachine h login bob password hunter22\n"
            b"gho_bareTokenOnItsOwnLine\nurl: https://example.org\n")
    vals = values_in(data)
    assert {"AKIAIOSFODNN7EXAMPLE", "quoted-token-1", "hunter22",
            "gho_bareTokenOnItsOwnLine"} <= set(vals)
    assert "1" not in vals and "bob" not in vals          # too short to be a secret
    assert values_in(b'{"auths": {"r.io": {"auth": "dXNlcjpwYXNzd29yZA=="}}}') == ["dXNlcjpwYXNzd29yZA=="]
    key = b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk\n-----END OPENSSH PRIVATE KEY-----\n"
    assert any("b3BlbnNzaC1rZXk" in v for v in values_in(key))
    assert values_in(b"\0binary keyring") == []


@pytest.mark.parametrize("text, kind", [
    ("AKIAIOSFODNN7EXAMPLE", "aws-access-key"),
    ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "aws-secret-key"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----", "private-key"),
    ("ghp_" + "a" * 36, "github-token"),
    ("xoxb-1234567890-abcdef", "slack-token"),
    ("sk-ant-api03-" + "x" * 30, "anthropic-key"),
    ("sk-proj-" + "y" * 30, "openai-key"),
    ("AIza" + "b" * 35, "google-api-key"),
    ("Authorization: Bearer abcdefghijklmnopqrstuvwxyz", "bearer-token"),
    ("https://user:pa55word@example.org/x", "url-password"),
    ("password = hunter2222", "password"),
    ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "jwt"),
])
def test_token_shapes_are_replaced_by_their_kind(text, kind):
    found: set[str] = set()
    out = Redactor().text(f"before {text} after", found)
    assert f"<redacted:{kind}>" in out and kind in found
    assert out.startswith("before ") and out.endswith(" after")


def test_values_are_replaced_longest_first_and_cut_values_at_boundaries():
    r = Redactor()
    r.add_values(["abcdef12", "abcdef12345678"], "dotenv")
    assert r.text("x abcdef12345678 y") == "x <redacted:dotenv> y"
    found: set[str] = set()
    assert r.cut_ends("tail of head abcdef1", start=False, end=True, found=found) \
        == "tail of head <redacted:dotenv>" and found == {"dotenv"}
    assert r.cut_ends("345678 rest", start=True, end=False) == "<redacted:dotenv> rest"
    # Not at a cut: a name that merely ends like a value begins stays as it is.
    assert r.text("src/abcd") == "src/abcd"


@pytest.mark.parametrize("rel, kind", [
    (".ssh/github_deploy", "ssh-private-key"), (".ssh/id_ed25519", "ssh-private-key"),
    (".ssh/id_ed25519.pub", None), (".ssh/known_hosts", None), (".ssh/known_hosts.old", None),
    (".ssh/config", None), (".ssh/authorized_keys", None), (".claude.json", "claude-code-login"),
    (".cache/huggingface/token", "huggingface-token"),
    (".config/rclone/rclone.conf", "rclone-credentials"), (".bash_history", "shell-history"),
    # round 4
    (".config/git/credentials", "git-credentials"), (".s3cfg", "aws-credentials"),
    (".config/github-copilot/apps.json", "github-copilot-token"), (".yarnrc.yml", "npm-token"),
    (".bundle/config", "rubygems-key"), (".config/composer/auth.json", "composer-token"),
    (".boto", "gcloud-credentials"), (".databrickscfg", "databricks-token"),
    # round 5: keys below ~/.ssh's subdirectories, whole tool directories, more stores
    (".ssh/keys/github", "ssh-private-key"), (".ssh/keys/github.pub", None),
    (".ssh/work/config", None), (".aws/sso/cache/t.json", "aws-credentials"),
    (".kube/prod.yaml", "kube-config"), (".config/sops/age/keys.txt", "sops-key"),
    (".curlrc", "curl-credentials"), (".histfile", "shell-history"),
    (".config/containers/auth.json", "container-registry-login"),
    (".netrc.bak", "netrc"), (".pgpass.old", "postgres-password"), (".npmrc.bak", "npm-token"),
    # round 7: tools' logins, keys and browsers in snap and flatpak homes
    (".config/stripe/config.toml", "stripe-key"), (".wrangler/config/default.toml",
                                                   "cloudflare-token"),
    (".config/.wrangler/config/default.toml", "cloudflare-token"),
    (".config/ngrok/ngrok.yml", "ngrok-token"), (".android/adbkey", "adb-key"),
    (".android/adbkey.pub", None), (".terraformrc", "terraform-token"),
    (".sentryclirc", "sentry-token"),
    ("snap/firefox/common/.mozilla/firefox/x.default/logins.json", "browser-profile"),
    (".var/app/org.mozilla.firefox/.mozilla/firefox/x.default/key4.db", "browser-profile"),
    ("snap/chromium/common/chromium/Default/Login Data", "browser-profile"),
    (".var/app/com.google.Chrome/config/google-chrome/Default/Cookies", "browser-profile")])
def test_credential_stores_by_location(rel, kind):
    """Round 3 read these unseen: a key under any name in ~/.ssh (its public
    halves, known_hosts, config and authorized_keys are none), Claude Code's
    ~/.claude.json, tokens of Hugging Face and rclone, shell histories."""
    from caper.report.secrets import Protected, default_patterns
    assert Protected(default_patterns(), "/home/u").kind(f"/home/u/{rel}") == kind


@pytest.mark.parametrize("rel, kind", [
    ("deploy/server.p12", "private-key"), ("certs/client.pfx", "private-key"),
    ("android/release.keystore", "private-key"), ("app/upload.jks", "private-key"),
    ("ops/putty.ppk", "private-key"), ("tls/server-key.pem", "private-key"),
    ("tls/privkey.pem", "private-key"), ("prod.kubeconfig", "kube-config"),
    ("ci/kubeconfig", "kube-config"), ("home/.netrc", "netrc"), ("_netrc", "netrc"),
    ("ci/.git-credentials", "git-credentials"), ("ci/.pypirc", "pypi-token"),
    # certificates and CA bundles are public: pip and curl read them at every run
    ("tls/server.pem", None), (".venv/lib/python3.11/site-packages/certifi/cacert.pem", None),
    ("tls/fullchain.pem", None)])
def test_workspace_key_files_by_name(rel, kind):
    """Round 7: key stores, PuTTY keys, PEM private keys and kubeconfigs in
    the workspace were read as no credential, so nothing stopped a process
    that read them from reaching an allowed host."""
    from caper.report.secrets import Protected, default_patterns
    assert Protected(default_patterns(), "/home/u", "/w").kind(f"/w/{rel}") == kind


def test_capers_own_git_runs_no_program_the_repository_configures(tmp_path):
    """caper reads a credential's git history on the host while it builds a
    report: the repository's log.showSignature + gpg.program (planted through
    .git/commondir or an earlier run) must not run there (before, a signed
    commit on any ref ran the planted program during a blocked run)."""
    import subprocess
    from caper.report.workspace import history_values
    ws = tmp_path / "ws"
    ws.mkdir()
    g = ["git", "-c", "user.email=t@t", "-c", "user.name=t", "-C", str(ws)]
    subprocess.run(g + ["init", "-q"], check=True)
    (ws / ".env").write_text("API_TOKEN=abcdef0123456789xyz\n")
    subprocess.run(g + ["add", ".env"], check=True)
    subprocess.run(g + ["commit", "-qm", "init"], check=True)
    canary = tmp_path / "ran"
    gpg = tmp_path / "gpg.sh"
    gpg.write_text(f"#!/bin/sh\ntouch {canary}\nexit 1\n")
    gpg.chmod(0o755)
    raw = subprocess.run(g + ["cat-file", "commit", "HEAD"], check=True,
                         capture_output=True, text=True).stdout
    head, _, body = raw.partition("\n\n")
    signed = (head + "\ngpgsig -----BEGIN PGP SIGNATURE-----\n \n x\n -----END PGP SIGNATURE-----"
              + "\n\n" + body)
    sha = subprocess.run(g + ["hash-object", "-t", "commit", "-w", "--stdin"], input=signed,
                         check=True, capture_output=True, text=True).stdout.strip()
    subprocess.run(g + ["update-ref", "refs/heads/signed", sha], check=True)
    subprocess.run(g + ["config", "log.showSignature", "true"], check=True)
    subprocess.run(g + ["config", "gpg.program", str(gpg)], check=True)
    subprocess.run(["git", "-C", str(ws), "log", "--all", "-p", "--format=", "--", ".env"],
                   capture_output=True)
    assert canary.exists(), "the set-up does not make git run gpg.program"
    canary.unlink()
    assert "abcdef0123456789xyz" in " ".join(history_values(str(ws), ".env"))
    assert not canary.exists()


def test_home_patterns_hold_in_every_accounts_home():
    """Round 4: `~` was the run's own home only, so a run as root (or with
    HOME pointed elsewhere) read /home/alice/.ssh/id_ed25519 as no credential
    and returned it reversed. Every account's home (and /root) counts."""
    import pwd
    from caper.report.secrets import account_homes
    p = Protected(default_patterns(), HOME, "/w", homes=["/home/alice", "/root"])
    assert p.kind("/home/alice/.ssh/id_ed25519") == "ssh-private-key"
    assert p.kind("/root/.aws/credentials") == "aws-credentials"
    assert p.kind(f"{HOME}/.netrc") == "netrc"
    assert p.kind("/home/alice/proj/main.py") is None
    assert p.kind("/srv/bob/.aws/credentials") is None
    assert Protected(default_patterns(), HOME, "/w", homes=["/srv/bob"]).kind(
        "/srv/bob/.aws/credentials") == "aws-credentials"
    # by their usual place whatever passwd says (LDAP homes are not enumerated)
    p = Protected(default_patterns(), HOME, "/w", homes=[])
    assert p.kind("/home/carol/.ssh/id_ed25519") == "ssh-private-key"
    assert p.kind("/root/.aws/credentials") == "aws-credentials"
    assert p.kind("/home/carol/sub/.aws/credentials") is None
    # elsewhere, by passwd, read again for every run (a gate outlives a useradd)
    assert "/var/lib/postgresql" in account_homes() or not any(
        e.pw_dir == "/var/lib/postgresql" for e in pwd.getpwall())
    assert all(not h.startswith("/home/") and h != "/root" for h in account_homes())


def test_a_url_password_with_an_empty_user_is_a_token_shape():
    assert "hunter23y" not in Redactor().text("REDIS_URL=redis://:hunter23y@cache:6379/0")


def test_a_credential_file_is_settings_only_when_every_line_was_read_as_one():
    """Round 4: gem's `:rubygems_api_key: <hex>` (a YAML symbol key) was not
    read as an assignment, so the file counted as settings only and
    `rev ~/.gem/credentials` was committed with the key. Symbol keys and
    csh's `setenv` are read, and a line read as nothing makes the file hold
    a possible secret."""
    from caper.report.secrets import holds_no_secret
    gem = b"---\n:rubygems_api_key: 0123456789abcdef0123456789abcdef\n"
    assert values_in(gem) == ["0123456789abcdef0123456789abcdef"] and not holds_no_secret(gem)
    assert values_in(b"setenv API_KEY s3cr3tvalue123456\n") == ["s3cr3tvalue123456"]
    assert not holds_no_secret(b"[default]\nthis line sets nothing caper can read\n")
    assert holds_no_secret(b"[default]\nregion = eu-west-1\noutput = json\n")
    assert holds_no_secret(b"machine h login u password <password>\n")


def test_a_home_behind_a_symlink_is_protected_by_its_real_path_too(tmp_path):
    """Round 4: homes were matched as written; with the home a symlink (or
    below one: /home -> /data/home), its real path, which the command can
    name, was no credential location and a blocked run returned the key."""
    real = tmp_path / "data" / "me"
    (real / ".aws").mkdir(parents=True)
    link = tmp_path / "home-me"
    link.symlink_to(real)
    p = Protected(default_patterns(), str(link), "/w", homes=[])
    assert p.kind(f"{link}/.aws/credentials") == "aws-credentials"
    assert p.kind(f"{real}/.aws/credentials") == "aws-credentials"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to bind-mount")
def test_a_home_mounted_at_another_path_is_protected_there_too(tmp_path):
    """Round 5: a home bound elsewhere (/home at /srv/home, a container's
    -v /home:/host/home) showed its keys at a path that was no credential
    location; every mount alias of a home counts (mountinfo.aliases)."""
    import subprocess
    from caper.report.secrets import protected_for
    home, alias = tmp_path / "home", tmp_path / "alias"
    (home / ".aws").mkdir(parents=True)
    alias.mkdir()
    subprocess.run(["mount", "--bind", str(home), str(alias)], check=True)
    try:
        p = protected_for(default_patterns(), str(home), str(tmp_path / "ws"))
        assert p.kind(f"{alias}/.aws/credentials") == "aws-credentials"
        assert p.kind(f"{home}/.aws/credentials") == "aws-credentials"
    finally:
        subprocess.run(["umount", str(alias)], check=True)


def test_a_credential_directory_that_is_a_symlink_is_protected_where_it_leads(tmp_path):
    """Round 5: WSL's ~/.aws -> /mnt/c/Users/me/.aws (or a dotfile manager's
    link): the keys read by the real path matched no ~ form."""
    home, real = tmp_path / "home", tmp_path / "mnt" / "aws"
    home.mkdir()
    real.mkdir(parents=True)
    (home / ".aws").symlink_to(real)
    p = Protected(default_patterns(), str(home), "/w", homes=[])
    assert p.kind(f"{real}/credentials") == "aws-credentials"
    assert p.kind(f"{tmp_path}/mnt/other/credentials") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to bind-mount")
def test_a_directory_below_a_home_mounted_elsewhere_is_protected_there(tmp_path):
    """Round 5: ~/.aws bound at /x was taken for another home (/x/.aws/...),
    and /etc seen through a container's -v /:/host was no credential place:
    a path below a mount that shows another directory is judged as that
    directory's (mount_translations)."""
    import subprocess
    from caper.report.secrets import protected_for
    home, alias = tmp_path / "home", tmp_path / "x"
    (home / ".config").mkdir(parents=True)
    alias.mkdir()
    subprocess.run(["mount", "--bind", str(home / ".config"), str(alias)], check=True)
    try:
        p = protected_for(default_patterns(), str(home), str(tmp_path / "ws"))
        assert p.kind(f"{alias}/gcloud/application_default_credentials.json") == \
            "gcloud-credentials"
        assert p.kind(f"{alias}/notes.txt") is None
    finally:
        subprocess.run(["umount", str(alias)], check=True)


@pytest.mark.parametrize("path, kind", [
    (f"{HOME}/.config/configstore/firebase-tools.json", "cli-login"),
    (f"{HOME}/.config/configstore/snyk.json", "cli-login"),
    (f"{HOME}/.config/netlify/config.json", "cli-login"),
    (f"{HOME}/.railway/config.json", "cli-login"), (f"{HOME}/.bunfig.toml", "npm-token"),
    (f"{HOME}/.m2/settings-security.xml", "maven-credentials"),
    ("/w/local_settings.py", "app-secrets"), ("/w/mysite/settings/local.py", "app-secrets"),
    ("/w/appsettings.Production.json", "app-secrets"),
    ("/w/appsettings.Development.json", "app-secrets"), ("/w/appsettings.json", None),
    ("/w/config/database.yml", "app-secrets"), ("/w/config/master.key", "private-key"),
    ("/w/config/credentials/production.key", "private-key"),
])
def test_cli_logins_and_framework_secret_files_are_credentials(path, kind):
    """adv10b 19, 20: Node CLIs' configstore logins (firebase's refresh
    token, snyk's), netlify's and railway's tokens, Maven's master password,
    Django's local settings, .NET's per-environment appsettings, Rails'
    database.yml and master key were read, encoded and committed."""
    assert Protected(default_patterns(), HOME, "/w").kind(path) == kind
