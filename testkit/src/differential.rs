//! Replies compared command by command between the proxy and one redis-server: the tests of
//! the command families the proxy serves by fan-out (sorted sets, hashes) send the same
//! session to both and want the same bytes back.

use crate::resp::Client;

/// Sends every line of `lines` (words split by spaces, each `{name}` placeholder of `names`
/// filled) to `ours` and to `theirs`, one by one, and asserts the replies are identical
/// (`label` names the run in a failure). Returns how many lines were compared.
pub async fn assert_same_replies(
    ours: &mut Client,
    theirs: &mut Client,
    lines: &[&str],
    names: &[(&str, &str)],
    label: &str,
) -> usize {
    for line in lines {
        let filled = names.iter().fold(line.to_string(), |line, (name, value)| {
            line.replace(name, value)
        });
        let args: Vec<&str> = filled.split(' ').collect();
        let (got, want) = (ours.cmd(&args).await, theirs.cmd(&args).await);
        assert_eq!(got, want, "{label}: {args:?}");
    }
    lines.len()
}

/// [`assert_same_replies`] in RESP2, then in RESP3 (`HELLO`), on fresh connections to the
/// servers on `ours` and `theirs`; `names` gives each placeholder its key for a protocol (so
/// the second run starts from fresh keys). Returns the RESP3 connection to `ours`.
pub async fn assert_same_replies_in_resp2_and_resp3(
    ours: u16,
    theirs: u16,
    lines: &[&str],
    names: &[&str],
) -> Client {
    let mut last = None;
    for protocol in ["2", "3"] {
        let mut to_ours = Client::connect(ours).await;
        let mut to_theirs = Client::connect(theirs).await;
        for c in [&mut to_ours, &mut to_theirs] {
            c.cmd(&["HELLO", protocol]).await;
        }
        let keys: Vec<(String, String)> = names
            .iter()
            .map(|name| {
                let bare = name.trim_matches(['{', '}']);
                (name.to_string(), crate::key(&format!("{bare}{protocol}")))
            })
            .collect();
        let keys: Vec<(&str, &str)> = keys.iter().map(|(n, k)| (n.as_str(), k.as_str())).collect();
        let label = format!("RESP{protocol}");
        assert_same_replies(&mut to_ours, &mut to_theirs, lines, &keys, &label).await;
        last = Some(to_ours);
    }
    last.expect("two runs")
}
