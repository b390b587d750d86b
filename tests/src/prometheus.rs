//! Reading a Prometheus text exposition, as the suites read the servers'
//! and the apiserver's `/metrics`.

use std::collections::BTreeMap;

/// Sum of the Prometheus counter `name` over the series whose labels
/// include every pair of `labels`, in a text exposition.
pub fn counter(exposition: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    exposition
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labelset, value) = match rest.strip_prefix('{') {
                Some(r) => {
                    let (l, v) = r.split_once('}')?;
                    (parse_labels(l), v)
                }
                None if rest.starts_with(' ') => (BTreeMap::new(), rest),
                None => return None,
            };
            labels
                .iter()
                .all(|(k, v)| labelset.get(*k).map(String::as_str) == Some(*v))
                .then(|| value.trim().parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// `a="x",b="y"` as a map (label values here hold no quotes or commas).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    text.split(',')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((k.trim().to_owned(), v.trim().trim_matches('"').to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::counter;

    #[test]
    fn counters_are_summed_over_matching_series() {
        let text = "# TYPE w counter\n\
                    w{namespace=\"a\",op=\"apply\"} 3\n\
                    w{namespace=\"a\",op=\"delete\"} 1\n\
                    w{namespace=\"b\",op=\"apply\"} 7\n\
                    w_other{namespace=\"a\"} 100\n\
                    w 2\n";
        assert_eq!(counter(text, "w", &[("namespace", "a")]), 4.0);
        assert_eq!(counter(text, "w", &[("op", "apply")]), 10.0);
        assert_eq!(counter(text, "w", &[]), 13.0);
        assert_eq!(counter(text, "w", &[("namespace", "c")]), 0.0);
    }
}
