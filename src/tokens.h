/*-------------------------------------------------------------------------
 *
 * tokens.h
 *		Fencing tokens: the epoch, a key's first token and the next one
 *		(tokens.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TOKENS_H
#define IDEM_TOKENS_H

#include "extension_objects.h"

/* bits of a token below its epoch: 16 from SQL 0.3.0, 32 before */
extern int	idem_token_shift(const IdemObjects *objects);

/* the epoch of a token */
extern int64 idem_token_epoch_of(const IdemObjects *objects, int64 token);

/* the sequence's last value, read as its owner (0 before the first advance) */
extern int64 idem_token_epoch_now(const IdemObjects *objects);

/* refuse, saying what to do, when the epoch cannot move on by "by" */
extern void idem_token_epoch_require_room(const IdemObjects *objects, int64 epoch, int64 by);

/* nextval of the epoch, or an error that says what to do at its limit */
extern int64 idem_token_epoch_advance(const IdemObjects *objects);

/* the token of a new record: epoch * 2^shift + 1 */
extern int64 idem_token_first(const IdemObjects *objects);

/* the token that replaces token "old" (takeover, release, reuse) */
extern int64 idem_token_next(const IdemObjects *objects, int64 old);

#endif							/* IDEM_TOKENS_H */
