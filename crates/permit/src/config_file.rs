//! `permit serve --config FILE`: a TOML file whose keys are `serve`'s flags, and the precedence
//! flag > environment (`PERMIT_*`) > file > default.
//!
//! Generic over `serve`'s arguments: a key is a flag's long name, and a file value becomes that
//! flag's command-line form, appended to the command line only where clap took the default (no
//! flag and no environment variable set it). The file's values thus go through the same parsers
//! and relations (`requires`, `conflicts_with`) as flags, and no flag can be forgotten here.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, Command};

/// The flag that names the file (`--config`, `PERMIT_CONFIG`); a file cannot set it.
pub const CONFIG_ARG: &str = "config";

/// The environment variable of the root token's secret, read by `serve` itself (not a flag).
pub const ROOT_TOKEN_ENV: &str = "PERMIT_ROOT_TOKEN";

/// One key of a file, turned into the command-line arguments it stands for.
struct Setting {
    /// The clap id of the flag.
    id: String,
    /// `--key=value`, once per value (none for a boolean set to false).
    args: Vec<OsString>,
}

/// Where the effective value of each setting came from, for `permit config show`.
#[derive(Debug, Default)]
pub struct Sources {
    /// The ids of the settings the `--config` file supplied.
    pub from_file: BTreeSet<String>,
}

/// The flags of `command` a file may set: its own long flags, without the client's global
/// flags (hidden in `serve`), `--help`, `--version` and `--config` itself.
pub fn settable<'a>(command: &'a Command) -> impl Iterator<Item = &'a Arg> + 'a {
    command.get_arguments().filter(|arg| {
        arg.get_long().is_some()
            && !arg.is_global_set()
            && !arg.is_hide_set()
            && arg.get_id() != CONFIG_ARG
            && !matches!(arg.get_action(), ArgAction::Help | ArgAction::HelpLong | ArgAction::Version)
    })
}

/// The 1-based line of byte offset `at` in `text`.
fn line_of(text: &str, at: usize) -> usize {
    text.as_bytes()[..at.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// Reads and checks a file against the flags of `command`: every key must name a flag, and
/// every value must be one the flag accepts.
///
/// # Errors
/// A message naming the file, the line and the key at fault.
fn load(path: &Path, command: &Command) -> anyhow::Result<Vec<Setting>> {
    let file = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {file}: {e}"))?;
    let table: BTreeMap<String, toml::Spanned<toml::Value>> =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{file}: {}", e.to_string().trim_end()))?;
    // `command` without environment variables, to parse one file value at a time.
    let alone = command.clone().no_binary_name(true).mut_args(|arg| arg.env(None::<&'static str>));
    let mut settings = Vec::new();
    for (key, value) in &table {
        let line = line_of(&text, value.span().start);
        let at = |message: String| anyhow::anyhow!("{file}:{line}: key `{key}`: {message}");
        let Some(arg) = settable(command).find(|arg| arg.get_long() == Some(key.as_str())) else {
            let known: Vec<&str> = settable(command).filter_map(Arg::get_long).collect();
            return Err(if key == CONFIG_ARG {
                at("a configuration file cannot name another one".into())
            } else {
                at(format!("unknown key; the keys are `permit serve`'s flags: {}", known.join(", ")))
            });
        };
        let values: Vec<String> = match (arg.get_action(), value.get_ref()) {
            (ArgAction::SetTrue, toml::Value::Boolean(true)) => vec![],
            (ArgAction::SetTrue, toml::Value::Boolean(false)) => {
                settings.push(Setting { id: arg.get_id().to_string(), args: vec![] });
                continue;
            }
            (ArgAction::SetTrue, other) => {
                return Err(at(format!("expected true or false, not {}", other.type_str())))
            }
            (ArgAction::Append, toml::Value::Array(items)) => {
                items.iter().map(|item| scalar(item).map_err(&at)).collect::<anyhow::Result<_>>()?
            }
            (_, value) => vec![scalar(value).map_err(at)?],
        };
        let long = arg.get_long().expect("settable flags are long");
        let args: Vec<OsString> = if values.is_empty() {
            vec![format!("--{long}").into()]
        } else {
            values.iter().map(|value| format!("--{long}={value}").into()).collect()
        };
        // The flag's own parser, on this value alone: the message is clap's, with the file and
        // line in front. Relations to other flags are checked once all values are in place.
        if let Err(error) = alone.clone().try_get_matches_from(&args) {
            if !matches!(error.kind(), ErrorKind::MissingRequiredArgument | ErrorKind::ArgumentConflict) {
                return Err(at(clap_message(&error)));
            }
        }
        settings.push(Setting { id: arg.get_id().to_string(), args });
    }
    Ok(settings)
}

/// A TOML scalar as a flag's value: strings as they are, numbers in decimal.
fn scalar(value: &toml::Value) -> Result<String, String> {
    match value {
        toml::Value::String(text) => Ok(text.clone()),
        toml::Value::Integer(number) => Ok(number.to_string()),
        other => Err(format!("expected a string or an integer, not {}", other.type_str())),
    }
}

/// The first line of a clap error, without its `error: ` prefix.
fn clap_message(error: &clap::Error) -> String {
    let text = error.to_string();
    let line = text.lines().next().unwrap_or_default();
    line.strip_prefix("error: ").unwrap_or(line).to_owned()
}

/// The subcommand (and its matches) that takes `serve`'s flags: `serve` or `config show`.
fn serving<'a>(command: &'a Command, matches: &'a ArgMatches) -> Option<(&'a Command, &'a ArgMatches)> {
    match matches.subcommand()? {
        ("serve", serve) => Some((command.find_subcommand("serve")?, serve)),
        ("config", config) => match config.subcommand()? {
            ("show", show) => Some((command.find_subcommand("config")?.find_subcommand("show")?, show)),
            _ => None,
        },
        _ => None,
    }
}

/// Applies the `--config` file of `serve` or `config show`: parses `argv` with `command`, and
/// when a file is named, parses again with the file's values appended for the flags that no
/// flag or environment variable set.
///
/// # Errors
/// A bad file (see [`load`]), or file values that break a relation between flags.
pub fn apply(
    command: &Command,
    mut argv: Vec<OsString>,
    matches: ArgMatches,
) -> anyhow::Result<(ArgMatches, Sources)> {
    let Some((serve, serve_matches)) = serving(command, &matches) else {
        return Ok((matches, Sources::default()));
    };
    let Some(path) = serve_matches.get_one::<PathBuf>(CONFIG_ARG).cloned() else {
        return Ok((matches, Sources::default()));
    };
    let mut from_file = BTreeSet::new();
    for setting in load(&path, serve)? {
        let source = serve_matches.value_source(&setting.id);
        if matches!(source, None | Some(ValueSource::DefaultValue)) {
            argv.extend(setting.args);
            from_file.insert(setting.id);
        }
    }
    let matches = command.clone().try_get_matches_from(&argv).map_err(|error| {
        anyhow::anyhow!("{} (with the values of {})", clap_message(&error), path.display())
    })?;
    Ok((matches, Sources { from_file }))
}

/// Checks a file on its own (without flags or `PERMIT_*` variables): its keys and values, and
/// the relations between them. Returns the matches of `serve` for it.
///
/// # Errors
/// The first problem, naming the file (and the line and key where it has them).
pub fn check(path: &Path, serve: &Command) -> anyhow::Result<ArgMatches> {
    let settings = load(path, serve)?;
    let mut argv: Vec<OsString> = vec!["serve".into()];
    argv.extend(settings.into_iter().flat_map(|setting| setting.args));
    serve
        .clone()
        .mut_args(|arg| arg.env(None::<&'static str>))
        .try_get_matches_from(&argv)
        .map_err(|error| anyhow::anyhow!("{}: {}", path.display(), clap_message(&error)))
}

/// The effective configuration of `serve` as TOML, each value with where it came from. Secret
/// values are never printed: the secrets are in files (only their paths are shown) and in
/// `PERMIT_ROOT_TOKEN` (only whether it is set).
pub fn show(serve: &Command, matches: &ArgMatches, file: Option<&Path>, sources: &Sources) -> String {
    let mut out = String::from(
        "# The effective configuration of `permit serve`: a flag beats its PERMIT_* variable, which\n\
         # beats the --config file, which beats the default.\n",
    );
    if let Some(file) = file {
        out.push_str(&format!("# --config {}\n", file.display()));
    }
    for arg in settable(serve) {
        let id = arg.get_id().as_str();
        let key = arg.get_long().expect("settable flags are long");
        let source = if sources.from_file.contains(id) {
            "from the file".to_owned()
        } else {
            match matches.value_source(id) {
                Some(ValueSource::CommandLine) => format!("from --{key}"),
                Some(ValueSource::EnvVariable) => {
                    format!(
                        "from {}",
                        arg.get_env().map_or_else(String::new, |env| env.to_string_lossy().into_owned())
                    )
                }
                _ => "default".to_owned(),
            }
        };
        let value = if matches!(arg.get_action(), ArgAction::SetTrue) {
            Some(toml::Value::Boolean(matches.get_flag(id)))
        } else {
            matches.get_raw(id).map(|raw| {
                let values: Vec<toml::Value> = raw.map(|value| typed(&value.to_string_lossy())).collect();
                match (arg.get_action(), <[_; 1]>::try_from(values)) {
                    (ArgAction::Append, Ok([one])) => toml::Value::Array(vec![one]),
                    (_, Ok([one])) => one,
                    (_, Err(many)) => toml::Value::Array(many),
                }
            })
        };
        match value {
            Some(value) => out.push_str(&format!("{key} = {value}  # {source}\n")),
            None => out.push_str(&format!("# {key} is not set\n")),
        }
    }
    let root_token = std::env::var(ROOT_TOKEN_ENV).is_ok_and(|value| !value.trim().is_empty());
    if root_token {
        out.push_str(&format!("# the root token's secret is set by {ROOT_TOKEN_ENV} (not shown)\n"));
    }
    out
}

/// A value as TOML: an integer where it reads as one (`id = 1`), else a string. A file with
/// either form gives the flag the same text, so the output reads back as the same settings.
fn typed(value: &str) -> toml::Value {
    match value.parse::<i64>() {
        Ok(number) if number.to_string() == value => toml::Value::Integer(number),
        _ => toml::Value::String(value.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flag of `serve` has its environment variable, named by one rule.
    #[test]
    fn every_flag_of_serve_has_its_environment_variable() {
        let command = crate::command_line();
        let serve = command.find_subcommand("serve").expect("serve");
        let mut flags = 0;
        for arg in settable(serve).chain(serve.get_arguments().filter(|arg| arg.get_id() == CONFIG_ARG)) {
            let long = arg.get_long().expect("a long flag");
            let expected = format!("PERMIT_{}", long.to_uppercase().replace('-', "_"));
            assert_eq!(arg.get_env().and_then(|env| env.to_str()), Some(expected.as_str()), "--{long}");
            flags += 1;
        }
        assert!(flags > 20, "only {flags} flags");
    }

    #[test]
    fn lines_count_from_one() {
        assert_eq!(line_of("a = 1\nb = 2\n", 0), 1);
        assert_eq!(line_of("a = 1\nb = 2\n", 6), 2);
    }
}
