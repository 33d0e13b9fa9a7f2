//! Division by a number fixed when a policy is made, as a multiplication: a 64-bit
//! division takes tens of cycles, and an in-process decision made three or four of them
//! (the window's start, what remains, how long until more, the packed level), by the
//! same few numbers every time.

/// `n / d` for a `d` known ahead: `n` times the reciprocal `floor((2^64 - 1) / d)`, the top
/// 64 bits of the product, then one correction.
///
/// That reciprocal is at most `2^64 / d`, so the product's top half never exceeds `n / d`;
/// and it is more than `2^64 / d - 1 - 1/d`, so it falls short by less than `1 + 1/d`
/// (`n` is below `2^64`): the estimate is the quotient or one less, and the remainder
/// tells which.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Divisor {
    divisor: u64,
    reciprocal: u64,
}

impl Divisor {
    /// Division by `divisor`; 0, which no algorithm has, counts as 1.
    pub(crate) const fn new(divisor: u64) -> Self {
        let divisor = if divisor == 0 { 1 } else { divisor };
        Self {
            divisor,
            reciprocal: u64::MAX / divisor,
        }
    }

    /// The number divided by.
    pub(crate) const fn get(self) -> u64 {
        self.divisor
    }

    /// `n / divisor`, rounded down.
    #[inline]
    pub(crate) fn divide(self, n: u64) -> u64 {
        let estimate = ((u128::from(n) * u128::from(self.reciprocal)) >> 64) as u64;
        let rest = n - estimate * self.divisor;
        if rest >= self.divisor {
            estimate + 1
        } else {
            estimate
        }
    }

    /// `n % divisor`.
    #[inline]
    pub(crate) fn remainder(self, n: u64) -> u64 {
        n - self.divide(n) * self.divisor
    }

    /// `n / divisor`, rounded up.
    #[inline]
    pub(crate) fn divide_ceil(self, n: u64) -> u64 {
        let quotient = self.divide(n);
        if quotient * self.divisor == n {
            quotient
        } else {
            quotient + 1
        }
    }

    /// [`divide`](Self::divide) of a wide `n`: by multiplication when `n` fits 64 bits
    /// (the usual case: quotas keep products under 2^53), by the 128-bit division
    /// otherwise; the result is the same.
    #[inline]
    pub(crate) fn divide_wide(self, n: u128) -> u128 {
        match u64::try_from(n) {
            Ok(n) => u128::from(self.divide(n)),
            Err(_) => n / u128::from(self.divisor),
        }
    }

    /// [`divide_ceil`](Self::divide_ceil) of a wide `n`, saturating at `u64::MAX`.
    #[inline]
    pub(crate) fn divide_ceil_wide(self, n: u128) -> u64 {
        match u64::try_from(n) {
            Ok(n) => self.divide_ceil(n),
            Err(_) => u64::try_from(n.div_ceil(u128::from(self.divisor))).unwrap_or(u64::MAX),
        }
    }
}

/// The greatest common divisor of `a` and `b`, at least 1.
pub(crate) fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn edges_divide_exactly() {
        let divisors = [
            1,
            2,
            3,
            7,
            10,
            1_000,
            60_000,
            86_400_000,
            u64::MAX / 3,
            u64::MAX,
        ];
        let numerators = [
            0,
            1,
            2,
            999,
            1_000,
            1_001,
            u64::MAX / 2,
            u64::MAX - 1,
            u64::MAX,
        ];
        for d in divisors {
            let divisor = Divisor::new(d);
            for n in numerators {
                assert_eq!(divisor.divide(n), n / d, "{n} / {d}");
                assert_eq!(divisor.remainder(n), n % d, "{n} % {d}");
                assert_eq!(divisor.divide_ceil(n), n.div_ceil(d), "{n} / {d} up");
            }
        }
    }

    #[test]
    fn wide_numerators_fall_back() {
        let divisor = Divisor::new(1_000);
        let wide = u128::from(u64::MAX) * 3;
        assert_eq!(divisor.divide_wide(wide), wide / 1_000);
        assert_eq!(
            u128::from(divisor.divide_ceil_wide(wide)),
            wide.div_ceil(1_000)
        );
        assert_eq!(Divisor::new(2).divide_ceil_wide(wide), u64::MAX);
        assert_eq!(divisor.divide_ceil_wide(1_001), 2);
    }

    proptest! {
        #[test]
        fn matches_the_native_division(n: u64, d in 1u64..) {
            let divisor = Divisor::new(d);
            prop_assert_eq!(divisor.divide(n), n / d);
            prop_assert_eq!(divisor.remainder(n), n % d);
            prop_assert_eq!(divisor.divide_ceil(n), n.div_ceil(d));
        }

        #[test]
        fn matches_the_native_division_by_small_divisors(n: u64, d in 1u64..100_000) {
            let divisor = Divisor::new(d);
            prop_assert_eq!(divisor.divide(n), n / d);
            prop_assert_eq!(divisor.divide_ceil(n), n.div_ceil(d));
        }
    }
}
