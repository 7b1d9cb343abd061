//! Costs summed exactly.
//!
//! Costs are reported as JSON numbers (`0.01`) and kept as `f64` in checkpoints and records,
//! but summed as decimals: adding `0.01` six times in binary floating point gives
//! `0.060000000000000005`, which is both wrong in a bill and wrong against a budget (five times
//! `0.01` would fall short of a `max_cost` of `0.05`). Each amount is taken as the shortest
//! decimal that reads back as it (what was written, for any cost of up to 15 significant digits),
//! the sum is exact, and the result is the `f64` nearest to it, which prints as the decimal.

use std::str::FromStr;

use rust_decimal::Decimal;

/// `amount` as the decimal it was written as, if it fits in a `Decimal` (28 digits).
fn decimal(amount: f64) -> Option<Decimal> {
    // `{}` prints the shortest decimal that reads back as the same f64, never in exponent form.
    Decimal::from_str_exact(&amount.to_string()).ok()
}

/// The `f64` nearest to `sum`.
fn nearest_f64(sum: Decimal) -> Option<f64> {
    f64::from_str(&sum.to_string()).ok()
}

/// `a + b`, summed as decimals (as floats if either does not fit in a decimal).
pub fn add(a: f64, b: f64) -> f64 {
    decimal(a)
        .zip(decimal(b))
        .and_then(|(a, b)| a.checked_add(b))
        .and_then(nearest_f64)
        .unwrap_or(a + b)
}

/// `count × each`, as decimals (as floats if it does not fit in a decimal).
pub fn times(count: u64, each: f64) -> f64 {
    decimal(each)
        .and_then(|each| each.checked_mul(Decimal::from(count)))
        .and_then(nearest_f64)
        .unwrap_or(count as f64 * each)
}

#[cfg(test)]
mod tests {
    use super::{add, times};

    #[test]
    fn cents_add_up_to_what_a_bill_says() {
        let mut total = 0.0;
        for _ in 0..6 {
            total = add(total, 0.01);
        }
        assert_eq!(total.to_string(), "0.06");
        let mut five = 0.0;
        for _ in 0..5 {
            five = add(five, 0.01);
        }
        assert!(five >= 0.05, "{five}");
        assert_eq!(add(0.1, 0.2).to_string(), "0.3");
        assert_eq!(add(1.5, 3.0), 4.5);
    }

    #[test]
    fn multiples_are_exact_too() {
        assert_eq!(times(3, 0.1).to_string(), "0.3");
        assert_eq!(times(0, 0.7), 0.0);
        assert_eq!(times(2, 1.5), 3.0);
    }

    #[test]
    fn numbers_beyond_a_decimal_fall_back_to_floats() {
        assert_eq!(add(1e300, 1e300), 2e300);
        assert_eq!(add(1e-300, 0.0), 1e-300);
        assert_eq!(times(2, 1e300), 2e300);
    }
}
