//! The pure rules of taking units out of an outbound and bringing them back.

use super::*;
use crate::domain::{Holds, OutboundStatus};
use crate::store::{self, LineRow, Units};

fn line(sku: &str, quantity: i32, returned_quantity: i32) -> LineRow {
    LineRow {
        sku_id: sku.into(),
        quantity,
        returned_quantity,
    }
}

fn units(sku: &str, quantity: i32) -> Units {
    Units {
        sku_id: sku.into(),
        quantity,
    }
}

#[test]
fn a_refund_takes_at_most_what_each_line_has_left() {
    let lines = [line("A", 2, 0), line("B", 3, 1)];
    assert_eq!(take(&lines, &[units("A", 1)]), [units("A", 1)]);
    assert_eq!(
        take(&lines, &[units("B", 5), units("A", 3)]),
        [units("A", 2), units("B", 2)],
        "capped per line, by what is not back yet, sorted by SKU"
    );
    assert_eq!(
        take(&lines, &[units("A", 1), units("A", 2)]),
        [units("A", 2)],
        "two refunds of one SKU never take more than the line has"
    );
    assert!(
        take(&lines, &[units("C", 1)]).is_empty(),
        "a SKU not in the outbound"
    );
    assert!(
        take(&[line("A", 1, 1)], &[units("A", 1)]).is_empty(),
        "all back already"
    );
}

fn hold(lines: Option<&[Units]>) -> store::HoldRow {
    store::HoldRow {
        hold: "refund:R".into(),
        active: true,
        lines: lines.map(|l| sqlx::types::Json(l.to_vec())),
    }
}

#[test]
fn a_return_brings_what_the_holds_expect_and_nothing_already_back() {
    let lines = [line("A", 3, 1), line("B", 2, 0)];
    assert_eq!(
        expected_back(&lines, &[hold(Some(&[units("A", 1)]))]),
        [units("A", 1)],
        "a refund by line: its units only"
    );
    assert_eq!(
        expected_back(
            &lines,
            &[
                hold(Some(&[units("B", 1)])),
                hold(Some(&[units("A", 5), units("B", 2)]))
            ]
        ),
        [units("A", 2), units("B", 2)],
        "refunds by line together, capped by what is not back yet"
    );
    assert_eq!(
        expected_back(&lines, &[hold(Some(&[units("B", 1)])), hold(None)]),
        [units("A", 2), units("B", 2)],
        "a hold on the whole order: every unit not back yet"
    );
    assert!(expected_back(&[line("A", 1, 1)], &[hold(None)]).is_empty());
}

#[test]
fn a_return_ends_the_outbound_only_when_every_shipped_unit_is_back() {
    let free = Holds::default();
    let open = Holds {
        active: true,
        permanent: false,
    };
    let all_back = [line("A", 3, 3), line("B", 1, 1)];
    let some_back = [line("A", 3, 1), line("B", 1, 0)];
    assert_eq!(after_return(&all_back, free), OutboundStatus::Returned);
    assert_eq!(
        after_return(&all_back, open),
        OutboundStatus::Returned,
        "nothing left to expect"
    );
    assert_eq!(
        after_return(&some_back, free),
        OutboundStatus::Shipped,
        "the received holds no longer recall it; the rest is with the buyer"
    );
    assert_eq!(
        after_return(&some_back, open),
        OutboundStatus::Recall,
        "a hold still counting keeps it recalled"
    );
}
