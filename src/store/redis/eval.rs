//! Running a script on one connection: `EVALSHA`, or `EVAL` with the source when the
//! server does not know it. The backend runs it on a single node, and the cluster module
//! on the node it routes each attempt to.

use redis::{ErrorKind, RedisError, Script, ServerErrorKind};

/// `EVALSHA`, or on NOSCRIPT (a restart, a `SCRIPT FLUSH`) `EVAL` with the source, which
/// runs in the same round trip and caches the script again. Unlike load-then-retry, no
/// flush between two commands can make it fail.
pub(super) async fn evaluate<T: redis::FromRedisValue>(
    connection: &mut impl redis::aio::ConnectionLike,
    script: &Script,
    source: &str,
    keys: &[Vec<u8>],
    args: &(impl redis::ToRedisArgs + Sync),
) -> Result<T, RedisError> {
    // Sized once: built argument by argument from empty, the command's buffers were
    // reallocated several times per call. Numbers take at most 20 bytes.
    let arg_count = redis::ToRedisArgs::num_of_args(args);
    let key_bytes: usize = keys.iter().map(Vec::len).sum();
    let command = |name: &str, script: &str| {
        let mut command = redis::Cmd::with_capacity(
            3 + keys.len() + arg_count,
            name.len() + script.len() + 20 + key_bytes + 20 * arg_count,
        );
        command
            .arg(name)
            .arg(script)
            .arg(keys.len())
            .arg(keys)
            .arg(args);
        command
    };
    match command("EVALSHA", script.get_hash())
        .query_async(connection)
        .await
    {
        Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            command("EVAL", source).query_async(connection).await
        }
        result => result,
    }
}
