//! How a claim's marks name events: only its own, each once per call.

use uuid::Uuid;

use super::{
    Fixture, Violation, claim, dead, failed, finish, ids_of, record, refused, refused_twice, stats,
};
use crate::testing::TestEvent;
use crate::{Claim, EventStatus, OutboxStore};

/// Marks name events by their seq, and a claim refuses a seq that is not
/// one of its records (another claim's, or none at all) with "not in
/// claim" from [`mark_sent`](Claim::mark_sent),
/// [`mark_suspect`](Claim::mark_suspect) and
/// [`mark_failed`](Claim::mark_failed), marking nothing of the call (not
/// even the claim's own seqs in it); the claim's own seqs are still marked
/// as usual afterwards.
///
/// # Errors
/// A [`Violation`] where the store breaks this (or fails).
pub async fn marks_refuse_seqs_not_in_the_claim<F: Fixture>(fixture: &F) -> Result<(), Violation> {
    const CHECK: &str = "marks_refuse_seqs_not_in_the_claim";
    let ids = record(fixture, CHECK, &[TestEvent::new("a"), TestEvent::new("b")]).await?;
    let (a, b) = (ids[0], ids[1]);
    let mine = claim(fixture, CHECK, 1).await?;
    let other = claim(fixture, CHECK, 1).await?;
    let (Some(mut mine), Some(other)) = (mine, other) else {
        return Err(Violation {
            check: CHECK,
            what: "two claims of one event each did not both get one".into(),
        });
    };
    ensure!(
        CHECK,
        ids_of(&mine) == [a] && ids_of(&other) == [b],
        "claims of one took {:?} and {:?}, expected [{a}] and [{b}]",
        ids_of(&mine),
        ids_of(&other)
    );
    let own = mine.records()[0].seq;
    let foreign = other.records()[0].seq;
    refused::<F>(
        CHECK,
        "mark_sent",
        mine.mark_sent(&[own, foreign]).await,
        Some(foreign),
    )?;
    refused::<F>(
        CHECK,
        "mark_suspect",
        mine.mark_suspect(&[foreign], "died").await,
        Some(foreign),
    )?;
    refused::<F>(
        CHECK,
        "mark_failed",
        mine.mark_failed(&[dead(own, 1), dead(foreign, 1)]).await,
        Some(foreign),
    )?;
    // Checked in call order: the foreign seq comes first, so it is the
    // refusal, not the duplicate after it.
    refused::<F>(
        CHECK,
        "mark_sent",
        mine.mark_sent(&[foreign, own, own]).await,
        Some(foreign),
    )?;
    let stranger = own.max(foreign) + 1_000;
    refused::<F>(CHECK, "mark_sent", mine.mark_sent(&[stranger]).await, None)?;
    finish(CHECK, mine).await?;
    finish(CHECK, other).await?;

    // Nothing of the refused calls was marked.
    let again = untouched(fixture, CHECK, &[a, b]).await?;
    finish(CHECK, again).await?;

    // The claim's own seq is marked as usual.
    let Some(mut mine) = claim(fixture, CHECK, 1).await? else {
        return Err(Violation {
            check: CHECK,
            what: "nothing claimable the second time".into(),
        });
    };
    ensure!(
        CHECK,
        ids_of(&mine) == [a],
        "the claim of one after refused marks took {:?}, expected [{a}]",
        ids_of(&mine)
    );
    let own = mine.records()[0].seq;
    mine.mark_failed(&[dead(own, 1)])
        .await
        .map_err(|e| failed(CHECK, "mark_failed of the claim's own seq", &e))?;
    finish(CHECK, mine).await?;
    let stats = stats(fixture, CHECK).await?;
    ensure!(
        CHECK,
        (stats.dead, stats.backlog) == (1, 1),
        "after marking its own seq dead: {} dead, backlog {}, expected 1 and 1",
        stats.dead,
        stats.backlog
    );
    Ok(())
}

/// One mark call names each event at most once: a seq named twice in one
/// [`mark_sent`](Claim::mark_sent), [`mark_suspect`](Claim::mark_suspect)
/// or [`mark_failed`](Claim::mark_failed) is refused with "duplicate seq"
/// naming the first seq named again, in call order, and nothing of the call
/// is marked (no attempt counted, no suspect
/// counted twice); the same seq named once is marked as usual afterwards.
///
/// # Errors
/// A [`Violation`] where the store breaks this (or fails).
pub async fn marks_refuse_a_seq_named_twice<F: Fixture>(fixture: &F) -> Result<(), Violation> {
    const CHECK: &str = "marks_refuse_a_seq_named_twice";
    let ids = record(fixture, CHECK, &[TestEvent::new("a"), TestEvent::new("a")]).await?;
    let Some(mut claimed) = claim(fixture, CHECK, 10).await? else {
        return Err(Violation {
            check: CHECK,
            what: "nothing claimable".into(),
        });
    };
    ensure!(
        CHECK,
        ids_of(&claimed) == ids,
        "a claim of 10 took {:?}, expected {ids:?}",
        ids_of(&claimed)
    );
    let first = claimed.records()[0].seq;
    let second = claimed.records()[1].seq;
    refused_twice::<F>(
        CHECK,
        "mark_sent",
        claimed.mark_sent(&[first, second, first]).await,
        first,
    )?;
    // Checked in call order: the first seq named again is the one named.
    refused_twice::<F>(
        CHECK,
        "mark_sent",
        claimed.mark_sent(&[second, first, second, first]).await,
        second,
    )?;
    refused_twice::<F>(
        CHECK,
        "mark_suspect",
        claimed.mark_suspect(&[second, second], "died").await,
        second,
    )?;
    refused_twice::<F>(
        CHECK,
        "mark_failed",
        claimed
            .mark_failed(&[dead(first, 1), dead(second, 1), dead(first, 2)])
            .await,
        first,
    )?;
    finish(CHECK, claimed).await?;

    let mut again = untouched(fixture, CHECK, &ids).await?;
    let seqs: Vec<i64> = again.records().iter().map(|r| r.seq).collect();
    again
        .mark_sent(&seqs)
        .await
        .map_err(|e| failed(CHECK, "mark_sent naming each seq once", &e))?;
    finish(CHECK, again).await?;
    let stats = stats(fixture, CHECK).await?;
    ensure!(
        CHECK,
        stats.backlog == 0,
        "after marking both sent the backlog is {}, expected 0",
        stats.backlog
    );
    Ok(())
}

/// After refused marks: a claim takes exactly `ids` again, each still
/// `Pending` with no attempt and no suspect counted. The claim, for more.
async fn untouched<F: Fixture>(
    fixture: &F,
    check: &'static str,
    ids: &[Uuid],
) -> Result<<F::Store as OutboxStore>::Claim, Violation> {
    let Some(again) = claim(fixture, check, 10).await? else {
        return Err(Violation {
            check,
            what: "after refused marks, nothing is claimable".into(),
        });
    };
    ensure!(
        check,
        ids_of(&again) == ids,
        "after refused marks a claim got {:?}, expected {ids:?}",
        ids_of(&again)
    );
    for record in again.records() {
        ensure!(
            check,
            record.status == EventStatus::Pending
                && record.attempts == 0
                && record.suspect_count == 0,
            "a refused mark changed event {}: {:?}, {} attempts, suspect count {}",
            record.id(),
            record.status,
            record.attempts,
            record.suspect_count
        );
    }
    Ok(again)
}
